"""`wait-chain` through RLocks whose owner Python records: the lock a thread waits for is a local name
of its frame (py-spy --locals gives its address), its owner is read from the process's memory, and the
finding names the owning thread by the ident py-spy reports, and what that thread waits for in turn."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Jobwarden
from tests.integration.hangcases import HANG, PY, finding
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TRANSFERS = """
import sys, threading


class Account:
    def __init__(self, name):
        self.name, self.lock = name, threading.RLock()


def transfer(source, target, both):
    debit, credit = source.lock, target.lock
    with debit:
        both.wait()  # each thread holds its first lock before either takes its second
        with credit:
            print("moved", source.name, "->", target.name)


def run(ids_file):
    a, b = Account("a"), Account("b")
    both = threading.Barrier(2)
    threads = [
        threading.Thread(target=transfer, args=(a, b, both), name="a-to-b"),
        threading.Thread(target=transfer, args=(b, a, both), name="b-to-a"),
    ]
    for t in threads:
        t.start()
    with open(ids_file, "w") as out:
        out.write(" ".join(str(t.ident) for t in threads))
    for t in threads:
        t.join()


run(sys.argv[1])
"""


def rlock_finding(jw: Jobwarden, job: int) -> dict[str, Any] | None:
    f = finding(jw, job, "wait-chain")
    return f if f is not None and "RLock" in f["title"] else None


def test_two_threads_each_holding_the_rlock_the_other_waits_for_are_a_deadlock(
    jw: Jobwarden, tmp_path: Path
) -> None:
    # the locks are attributes of objects handed to a function, then named by its locals: neither a
    # module's nor `self`'s, so the source alone cannot tell which lock is which; their owners can
    code = tmp_path / "transfers.py"
    code.write_text(TRANSFERS)
    code.chmod(0o644)
    ids = tmp_path / "idents"
    job = jw.start(PY, str(code), str(ids), options=HANG)["id"]
    try:
        f = eventually("an RLock wait-chain", lambda: rlock_finding(jw, job), 90)
        main_pid = jw.status(job)["pid"]
        a_to_b, b_to_a = ids.read_text().split()
        assert f["pids"][0] == main_pid, f
        assert f["title"] == f"Deadlock: 2 threads of pid {main_pid} wait for each other's RLocks", f
        credit = next(n for n, line in enumerate(TRANSFERS.splitlines(), 1) if "with credit:" in line)
        held = rf'"a-to-b" waits at {re.escape(str(code))}:{credit} for RLock `credit` at 0x[0-9a-f]+ held by'
        assert re.search(held + r' thread \d+ "b-to-a", which waits at line', f["summary"]), f
        # each owner is the other thread, by the ident threading gave it (py-spy's thread_id)
        evidence = " ".join(f["evidence"])
        assert f"thread ident {b_to_a}, taken 1 time (" in evidence, f
        assert f"thread ident {a_to_b}, taken 1 time (" in evidence, f
        assert '"b-to-a"' in f["summary"] and "a cycle, nobody can go on (a deadlock)" in f["summary"], f
    finally:
        jw("stop", str(job), check=True)


HOLDER = """
import os, subprocess, sys, threading


def refresh(lock, ready):
    lock.acquire()
    ready.set()
    r, w = os.pipe()
    # the helper keeps the pipe's write end and never writes: the read never ends, the lock is never freed
    subprocess.Popen(["sleep", "600"], stdout=w)
    os.close(w)
    os.read(r, 1)


def report(lock):
    with lock:
        print("report")


def main():
    cache_lock = threading.RLock()
    ready = threading.Event()
    holder = threading.Thread(target=refresh, args=(cache_lock, ready), name="refresher")
    holder.start()
    ready.wait()
    waiter = threading.Thread(target=report, args=(cache_lock,), name="reporter")
    waiter.start()
    waiter.join()


main()
"""


@pytest.mark.parametrize("launcher", ["python", "shell"])
def test_a_thread_waiting_for_an_rlock_whose_owner_reads_a_silent_pipe_names_the_owner_and_the_writer(
    jw: Jobwarden, tmp_path: Path, launcher: str
) -> None:
    code = tmp_path / "refresh.py"
    code.write_text(HOLDER)
    code.chmod(0o644)
    if launcher == "python":
        job = jw.start(PY, str(code), options=HANG)["id"]
    else:  # a shell script that runs it: the shell waits for its child, ahead of the locks
        script = tmp_path / "refresh.sh"
        script.write_text(f"{PY} {code}\necho done\n")
        job = jw.start("bash", str(script), options=HANG)["id"]
    try:
        f = eventually("an RLock wait-chain", lambda: rlock_finding(jw, job), 90)
        processes = jw.status(job)["processes"]
        python = next(p["pid"] for p in processes if str(code) in p["cmdline"])
        sleep = next(p["pid"] for p in processes if p["cmdline"].startswith("sleep "))
        assert f["pids"][0] == sleep, f
        assert python in f["pids"], f
        assert f'"reporter" of pid {python} waits for RLock `lock` at 0x' in f["title"], f
        assert '"refresher", which reads a pipe whose write end pid ' in f["title"], f
        assert f"pid {sleep} still holds open" in f["title"], f
        assert f"; pid {sleep} " in f["summary"] and "everything waits for it" in f["summary"], f
    finally:
        jw("stop", str(job), check=True)


SLEEPER = """
import threading, time


def checkpoint(state_lock, saved):
    with state_lock:
        saved.set()
        time.sleep(600)  # "waits for the storage to settle", holding the lock


def train(state_lock):
    state_lock.acquire()
    print("step")


def main():
    state_lock, saved = threading.RLock(), threading.Event()
    threading.Thread(target=checkpoint, args=(state_lock, saved), name="checkpointer", daemon=True).start()
    saved.wait()
    train(state_lock)


main()
"""


def test_the_main_thread_waiting_for_an_rlock_a_sleeping_thread_holds_names_the_sleeper(
    jw: Jobwarden, tmp_path: Path
) -> None:
    code = tmp_path / "train.py"
    code.write_text(SLEEPER)
    code.chmod(0o644)
    job = jw.start(PY, str(code), options=HANG)["id"]
    try:
        f = eventually("an RLock wait-chain", lambda: rlock_finding(jw, job), 90)
        main_pid = jw.status(job)["pid"]
        assert f["pids"][0] == main_pid, f
        assert re.fullmatch(
            rf'Thread {main_pid} "MainThread" of pid {main_pid} waits for RLock `state_lock` at 0x[0-9a-f]+'
            r' held by thread \d+ "checkpointer", which sleeps',
            f["title"],
        ), f
        sleep = next(n for n, line in enumerate(SLEEPER.splitlines(), 1) if "time.sleep(600)" in line)
        assert f["summary"].endswith(f'"checkpointer", which sleeps at checkpoint ({code}:{sleep}).'), f
    finally:
        jw("stop", str(job), check=True)

"""`wait-chain` cycles: across processes, kernel waits through different kinds of things (a pipe, a file
lock), every process and thing of it named, the process it closes on first; and between threads, the
`self._lock` of two objects, told apart by the address of each method's `self` in the hang's dump."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.integration.hangcases import HANG, PY, finding, hang_findings, wait_chain
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
REFRESH = """
import fcntl, subprocess, sys

cache = open(sys.argv[1], "a")
fcntl.flock(cache, fcntl.LOCK_EX)  # held while the helper refreshes it...
# ...but the helper takes the same lock first (flock(1)), and this process reads its output meanwhile
fresh = subprocess.run(["flock", sys.argv[1], "echo", "fresh"], stdout=subprocess.PIPE).stdout
"""


@pytest.mark.parametrize("launcher", ["python", "shell"])
def test_a_reader_of_a_helpers_pipe_holding_the_lock_the_helper_waits_for_is_a_deadlock(
    jw: Jobwarden, tmp_path: Path, launcher: str
) -> None:
    lock = tmp_path / "cache.lock"
    lock.touch()
    code = tmp_path / "refresh.py"
    code.write_text(REFRESH)
    if launcher == "python":
        job = jw.start(PY, str(code), str(lock), options=HANG)["id"]
    else:  # a shell script that runs it: the shell waits for it, outside the cycle
        script = tmp_path / "refresh.sh"
        script.write_text(f'{PY} {code} "$1"\necho done\n')
        job = jw.start("bash", str(script), str(lock), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        processes = jw.status(job)["processes"]
        reader = next(p["pid"] for p in processes if str(code) in p["cmdline"])
        helper = next(p["pid"] for p in processes if p["cmdline"].startswith("flock "))
        assert f["pids"][0] == reader, f
        assert helper in f["pids"]
        assert f["title"] == (f"Deadlock: 2 processes wait for each other (a pipe, a file lock on {lock})"), f
        assert f"which waits for a file lock on {lock} held by pid {reader} (" in f["summary"], f
        assert "a cycle, nobody can go on (a deadlock)" in f["summary"]
    finally:
        jw("stop", str(job), check=True)


TWO_CACHES = """
import threading


class Cache:
    def __init__(self, name):
        self.name = name
        self._lock = threading.Lock()
        self.peer = None
        self.both = None

    def sync(self):
        with self._lock:
            self.both.wait()
            self.peer.merge()

    def merge(self):
        with self._lock:
            print("merged", self.name)


left, right = Cache("left"), Cache("right")
left.peer, right.peer = right, left
left.both = right.both = threading.Barrier(2)
threads = [threading.Thread(target=c.sync, name=c.name) for c in (left, right)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_two_objects_whose_methods_take_each_others_self_lock_are_a_deadlock(
    jw: Jobwarden, tmp_path: Path
) -> None:
    # `with self._lock:` in methods: which object each thread's `self` is comes from the hang's dump
    code = tmp_path / "caches.py"
    code.write_text(TWO_CACHES)
    code.chmod(0o644)
    job = jw.start(PY, str(code), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        main_pid = jw.status(job)["pid"]
        assert f["pids"] == [main_pid], f
        assert f["title"].startswith(
            f"Deadlock: 2 threads of pid {main_pid} wait for each other's locks (self._lock of object 0x"
        ), f
        merge = next(n for n, line in enumerate(TWO_CACHES.splitlines(), 1) if "def merge" in line) + 1
        assert f'"left" waits at {code}:{merge} for lock self._lock of object 0x' in f["summary"], f
        assert '"right" waits at line' in f["summary"], f
        assert finding(jw, job, "no-progress") is None
    finally:
        jw("stop", str(job), check=True)


SLOW_CACHE = """
import threading, time


class Cache:
    def __init__(self):
        self._lock = threading.Lock()

    def refresh(self):
        with self._lock:
            time.sleep(600)  # a slow refresh holds the lock: the reader waits, nobody waits for it

    def read(self):
        with self._lock:
            return 1


cache = Cache()
threading.Thread(target=cache.refresh, name="refresher").start()
time.sleep(0.5)
cache.read()
"""


def test_a_method_waiting_for_its_objects_lock_held_by_a_sleeper_is_no_deadlock(
    jw: Jobwarden, tmp_path: Path
) -> None:
    code = tmp_path / "slow.py"
    code.write_text(SLOW_CACHE)
    code.chmod(0o644)
    job = jw.start(PY, str(code), options=HANG)["id"]
    try:
        found = eventually("a hang finding", lambda: hang_findings(jw, job), 90)
        assert [f["rule"] for f in found] == ["no-progress"], found
    finally:
        jw("stop", str(job), check=True)

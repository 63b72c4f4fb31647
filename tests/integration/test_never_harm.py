"""A supervisor must never harm its job (issue 20, class 1): a signal meant to be caught goes only to a
process that catches it now. Each test here failed before its fix: the dump signal's default action
killed a healthy process that had exec()ed out of the Python that advertised it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store
from tests.conftest import Jobwarden, alive, make_fifo, read_fifo, start_time
from tests.integration.test_diagnosis import wait_for_finding
from tests.support import eventually

pytestmark = pytest.mark.integration

# The job's main process starts a Python "daemon" (it runs the hooks, which advertise the dump signal),
# which then exec()s into another program: as Ray's raylet is started from Python. The main waits on it,
# so a daemon killed by the dump signal ends the job.
EXEC_INTO_DAEMON = """
import os, subprocess, sys
daemon = subprocess.Popen(
    [sys.executable, "-c", "import os; os.execv('/bin/sleep', ['sleep', '3600'])"]
)
with open(sys.argv[1], "w") as report:
    report.write(f"{daemon.pid}\\n")
sys.exit(daemon.wait())
"""


def start_daemon_job(jw: Jobwarden, tmp_path: Path, *options: str) -> tuple[int, int]:
    report = make_fifo(tmp_path / "report")
    job = jw.start(sys.executable, "-c", EXEC_INTO_DAEMON, str(report), options=options)
    daemon = int(read_fifo(report))
    wait_until_runs(daemon, "sleep")
    return job["id"], daemon


def wait_until_runs(pid: int, comm: str, timeout_s: float = 30) -> None:
    """The exec() has happened: the process's name is the new program's (a deadline, not a sleep)."""
    eventually(f"pid {pid} running {comm}", lambda: ProcFS().stat(pid).comm == comm, timeout_s, every_s=0.01)


def test_dump_never_signals_a_process_that_execed_out_of_python(jw: Jobwarden, tmp_path: Path) -> None:
    job, daemon = start_daemon_job(jw, tmp_path)
    born = start_time(daemon)
    assert born is not None
    advert = Store(jw.home).layout.py_dir(job, 1) / f"{daemon}.json"
    # the hooks ran in it before the exec(): the stale advert is there, once the shim has written it
    eventually("the daemon's advert", advert.exists, 30, every_s=0.01)

    stacks = {s["pid"]: s for s in jw.json("dump", str(job))}
    assert alive(daemon, born), "the dump signal killed the job's daemon"
    assert "it exec()ed" in (stacks[daemon]["error"] or "")
    assert jw.status(job)["state"] == "running"
    jw("stop", str(job), check=True)
    assert jw.status(job)["state"] == "stopped"


def test_a_hang_dump_leaves_an_execed_process_alive(jw: Jobwarden, tmp_path: Path) -> None:
    """The shim's own dumps (a hang, a lost worker) take every member's stacks: the daemon among them."""
    job, daemon = start_daemon_job(jw, tmp_path, "--hang-timeout", "2s", "--on-hang", "dump")
    born = start_time(daemon)
    wait_for_finding(jw, job, "wait-chain")  # the main process waits for its child, which sleeps
    dumped = {s["pid"] for s in jw.json("dump", str(job))}  # live again: the hang dump was stored before
    assert daemon in dumped
    assert alive(daemon, born), "the hang dump killed the job's daemon"
    assert jw.status(job)["state"] == "running"
    jw("stop", str(job), check=True)


# --- issue 25: the dump signal is sent only while its handler is the hooks' own ----------------------

# "Clean up and exit on any signal": the job sets its own handler on every catchable signal, the hooks'
# dump signal among them. It reports its pid once every handler is in, then waits.
CATCH_ALL = """
import os, signal, sys

def leave(signum, frame):
    sys.exit(3)

for s in signal.valid_signals():
    try:
        signal.signal(s, leave)
    except (OSError, ValueError, RuntimeError):
        pass  # SIGKILL, SIGSTOP: the kernel refuses
with open(sys.argv[1], "w") as report:
    report.write(f"{os.getpid()}\\n")
while True:
    signal.pause()
"""


def start_catch_all_job(jw: Jobwarden, tmp_path: Path, *options: str) -> tuple[int, int, int]:
    jw.env["JOBWARDEN_PY_SPY"] = "/nonexistent/py-spy"  # the fallback is all that is left
    jw.env["JOBWARDEN_GDB"] = "/nonexistent/gdb"
    report = make_fifo(tmp_path / "report")
    job = jw.start(sys.executable, "-c", CATCH_ALL, str(report), options=options)
    pid = int(read_fifo(report))
    born = start_time(pid)
    assert born is not None
    return job["id"], pid, born


def assert_says_why(error: str | None) -> None:
    assert "py-spy not found at /nonexistent/py-spy" in (error or "")  # why py-spy could not be used
    assert "the job set signal" in (error or "") and "a handler of its own" in (error or "")


def test_dump_never_runs_the_jobs_own_handler_of_the_dump_signal(jw: Jobwarden, tmp_path: Path) -> None:
    job, pid, born = start_catch_all_job(jw, tmp_path)
    (stack,) = [s for s in jw.json("dump", str(job)) if s["pid"] == pid]
    assert alive(pid, born), "the dump signal ran the job's handler, which ended the job"
    assert stack["method"] == "none" and stack["threads"] == []
    assert_says_why(stack["error"])
    assert jw.status(job)["state"] == "running"
    jw("stop", str(job), check=True)


def test_a_hang_dump_never_runs_the_jobs_own_handler(jw: Jobwarden, tmp_path: Path) -> None:
    job, pid, born = start_catch_all_job(jw, tmp_path, "--hang-timeout", "2s", "--on-hang", "dump")
    wait_for_finding(jw, job, "no-progress")
    with Store(jw.home) as store:
        hang = [d for d in store.stacks(job, 1) if d.trigger == "hang"]
    assert hang, "the hang watchdog stored no stacks"
    (stack,) = [s for s in hang[0].stacks if s.pid == pid]
    assert alive(pid, born), "the hang dump ran the job's handler, which ended the job"
    assert_says_why(stack.error)
    assert jw.status(job)["state"] == "running"
    jw("stop", str(job), check=True)


# --- issue 25: the hooks never write into, nor close, a descriptor the job reopened --------------------

# A daemonizer's start: close every descriptor, then open its own files, which get the numbers the hooks
# held (their FIFO to the shim, faulthandler's file). A forked child writes to both; the parent reaps it
# (a `reaped` line for the shim), writes to its data file, reports, and waits for a dump.
CLOSES_ITS_DESCRIPTORS = """
import os, signal, sys

report, data_path, other_path = sys.argv[1:4]
os.closerange(3, 1 << 16)
data = os.open(data_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
other = os.open(other_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
child = os.fork()
if child == 0:
    try:
        os.write(other, b"child other\\n")
        os.write(data, b"child data\\n")
    except OSError:
        os._exit(9)
    os._exit(0)
_, status = os.waitpid(child, 0)
os.write(data, b"parent data\\n")
with open(report, "w") as fh:
    fh.write(f"{os.getpid()} {data} {other} {status}\\n")
while True:
    signal.pause()
"""


def test_the_hooks_never_touch_the_jobs_files_after_it_closed_theirs(jw: Jobwarden, tmp_path: Path) -> None:
    jw.env["JOBWARDEN_PY_SPY"] = "/nonexistent/py-spy"  # a dump can only ask faulthandler
    jw.env["JOBWARDEN_GDB"] = "/nonexistent/gdb"
    report = make_fifo(tmp_path / "report")
    data, other = tmp_path / "data.txt", tmp_path / "other.txt"
    job = jw.start(sys.executable, "-c", CLOSES_ITS_DESCRIPTORS, str(report), str(data), str(other))["id"]
    pid, data_fd, other_fd, status = map(int, read_fifo(report).split())
    assert (data_fd, other_fd) == (3, 4)  # the numbers the hooks held: the test tests something
    assert status == 0, "the child's write failed: the hooks closed the job's descriptor in the child"
    assert data.read_bytes() == b"child data\nparent data\n"  # no born/reaped line of the hooks
    assert other.read_bytes() == b"child other\n"

    (stack,) = [s for s in jw.json("dump", str(job)) if s["pid"] == pid]
    assert stack["method"] == "none"
    # faulthandler's memfd was the job's first descriptor; the FIFO to the shim, opened to announce, next
    assert "no longer" in (stack["error"] or "") and "descriptor 3" in (stack["error"] or "")
    assert other.read_bytes() == b"child other\n", "faulthandler's dump went into the job's file"
    assert data.read_bytes() == b"child data\nparent data\n"
    assert jw.status(job)["state"] == "running"
    jw("stop", str(job), check=True)


# --- issue 25: fork records stay bounded, and a fork deadlock is still named -------------------------

# A thread holds a lock for ever and another spins; the main thread forks FORKS short-lived children at
# one call site, then (the spinner stopped, so that the job looks hung) one more there, which takes the
# lock copied held and never gets it.
FORKS = 300
FORKS_BESIDE_THREADS = """
import os, sys, threading

report, forks = sys.argv[1], int(sys.argv[2])
lock, held, spin = threading.Lock(), threading.Event(), [True]

def holder():
    with lock:
        held.set()
        threading.Event().wait()

def spinner():
    while spin[0]:
        pass

threading.Thread(target=holder, name="lock-holder", daemon=True).start()
threading.Thread(target=spinner, name="spinner", daemon=True).start()
held.wait()

def fork_one(last):
    pid = os.fork()
    if pid == 0:
        if last:
            with lock:
                pass
        os._exit(0)
    return pid

for n in range(forks + 1):
    if n == forks:
        spin[0] = False
    child = fork_one(n == forks)
    if n < forks:
        os.waitpid(child, 0)
with open(report, "w") as fh:
    fh.write(f"{child}\\n")
os.waitpid(child, 0)
"""


def test_fork_records_stay_bounded_and_name_the_fork_deadlock(jw: Jobwarden, tmp_path: Path) -> None:
    report = make_fifo(tmp_path / "report")
    options = ("--hang-timeout", "2s", "--on-hang", "dump")
    job = jw.start(sys.executable, "-c", FORKS_BESIDE_THREADS, str(report), str(FORKS), options=options)
    child = int(read_fifo(report))
    finding = wait_for_finding(jw, job["id"], "fork-deadlock")
    parent = jw.status(job["id"])["pid"]
    records = Store(jw.home).layout.py_dir(job["id"], 1) / f"{parent}.forks.jsonl"
    lines = records.read_text().splitlines()
    # 2 full records, then a count at 4, 8, ... 256: O(log n) lines, no line per child
    assert len(lines) <= 2 + 8, f"{len(lines)} lines of fork records"
    assert records.stat().st_size < 64 << 10

    assert child in finding["pids"]
    evidence = "\n".join(finding["evidence"])
    assert "lock-holder" in evidence  # the thread that held the lock at the site's recorded forks
    assert "fork_one" in evidence  # the fork site
    assert f"forked at least {FORKS + 1} times there" in evidence
    jw("stop", str(job["id"]), check=True)

"""A supervisor must never harm its job (issue 20, class 1): a signal meant to be caught goes only to a
process that catches it now. Each test here failed before its fix: the dump signal's default action
killed a healthy process that had exec()ed out of the Python that advertised it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store
from tests.conftest import Jobwarden, alive, make_fifo, read_fifo, start_time
from tests.integration.test_diagnosis import wait_for_finding

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
    deadline = time.monotonic() + timeout_s
    while ProcFS().stat(pid).comm != comm:
        assert time.monotonic() < deadline, f"pid {pid} never ran {comm}"
        time.sleep(0.01)


def test_dump_never_signals_a_process_that_execed_out_of_python(jw: Jobwarden, tmp_path: Path) -> None:
    job, daemon = start_daemon_job(jw, tmp_path)
    born = start_time(daemon)
    assert born is not None
    advert = Store(jw.home).layout.py_dir(job, 1) / f"{daemon}.json"
    assert advert.exists()  # the hooks ran in it before the exec(): the stale advert is there

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
    wait_for_finding(jw, job, "no-progress")
    dumped = {s["pid"] for s in jw.json("dump", str(job))}  # live again: the hang dump was stored before
    assert daemon in dumped
    assert alive(daemon, born), "the hang dump killed the job's daemon"
    assert jw.status(job)["state"] == "running"
    jw("stop", str(job), check=True)

"""Leftovers of earlier rounds (issue 20, item 10): each test here failed before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, kill_shim, make_fifo, read_fifo, wait_pid_gone, write_fifo

pytestmark = pytest.mark.integration

TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")
JOB_COMMANDS = ("status", "logs", "stop", "explain", "dump", "metrics", "rm", "wait", "adopt")


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_a_job_reference_that_is_not_utf8_names_no_job(jw: Jobwarden, command: str) -> None:
    # the bytes b"\xff\x1b]0;x\x07" as an argument: Python hands them over as surrogates, which SQLite
    # refused to encode ("internal error: UnicodeEncodeError")
    jw("run", "--name", "train", "--wait", "--", "true", check=True)
    result = jw(command, "\udcff\x1b]0;x\x07")
    assert result.returncode == (125 if command == "wait" else 1), result.stderr  # wait: 124 is still running
    assert result.stderr.startswith("jobwarden: no job ")
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert "\x1b" not in result.stderr  # the reference is quoted, never echoed raw


@pytest.mark.parametrize("how", ["ended", "lost"])
def test_orphans_kill_spares_a_process_started_with_a_jobs_variables_by_someone_else(
    jw: Jobwarden, tmp_path: Path, how: str
) -> None:
    # `orphans --kill` took any process that carried a job's marker variables for the job's leftover,
    # even one a live process outside the job started (this test, as a user's shell would) after the
    # job ended: within the 2 s slack of an ended run's end, or at any time after a lost run
    if how == "ended":
        job_id = int(jw("run", "--wait", "--", "true", check=True).stdout.split()[0])
    else:
        ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
        job = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
        read_fifo(ready)
        job_id = job["id"]
        kill_shim(jw, job_id)  # lost: no end on record
        write_fifo(go, "0 0\n")
        wait_pid_gone(job["pid"])
    marker = {"JOBWARDEN_HOME": str(jw.home), "JOBWARDEN_JOB_ID": str(job_id), "JOBWARDEN_RUN": "1"}
    bystander = subprocess.Popen(["sleep", "3600"], env={**os.environ, **marker}, stdin=subprocess.DEVNULL)
    try:
        assert jw.json("orphans") == []
        result = jw("orphans", "--kill", "--grace", "1s")
        assert result.returncode == 0 and "no strays" in result.stdout
        assert bystander.poll() is None, "a process the job never started was killed for it"
    finally:
        bystander.kill()
        bystander.wait()

"""`wait-chain` names the job a process outside the hung job belongs to, when it is another job of this
user's (shim.tree.whosejob): the holder of the lock the job waits for is a process that job's run recorded."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.integration.hangcases import HANG, PY, wait_chain
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
HOLD = """
import fcntl, sys, time
held = open(sys.argv[1], "a")
fcntl.flock(held, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)  # a long preparation step that keeps the cache locked
"""


def printed(jw: Jobwarden, job: int, text: str) -> bool:
    return text in jw("logs", str(job), check=True).stdout


def test_a_lock_held_by_another_job_of_this_user_names_that_job(jw: Jobwarden, tmp_path: Path) -> None:
    lock = tmp_path / "cache.lock"
    lock.touch()
    holder_script = tmp_path / "prep.py"
    holder_script.write_text(HOLD)
    prep = jw.start(PY, str(holder_script), str(lock), options=("--name", "prep-data"))["id"]
    try:
        eventually("the lock held", lambda: printed(jw, prep, "held"), 60)
        holder = jw.status(prep)["pid"]
        # a shell script's flock(1), as a cron job or a CI step serialises on a shared cache
        job = jw.start("bash", "-c", 'flock "$0" echo updating', str(lock), options=HANG)["id"]
        try:
            f = wait_chain(jw, job)
            assert f["pids"][0] == holder, f
            assert f["title"].startswith(
                f"Waits for a file lock on {lock} held by pid {holder} ({PY[:30]}"
            ), f
            assert f["title"].endswith(f'), of your job {prep} "prep-data"'), f
        finally:
            jw("stop", str(job), check=True)
    finally:
        jw("stop", str(prep), check=True)


def test_a_holder_that_only_copies_a_jobs_marker_is_not_named_as_that_job(
    jw: Jobwarden, tmp_path: Path
) -> None:
    # the marker is an environment variable anyone may set: without descent from the job, it is no proof
    lock = tmp_path / "cache.lock"
    lock.touch()
    sleeper = jw.start(PY, "-c", "import time; time.sleep(600)", options=("--name", "decoy"))["id"]
    holder_script = tmp_path / "hold.py"
    holder_script.write_text(HOLD)
    env = {**jw.env, "JOBWARDEN_JOB_ID": str(sleeper), "JOBWARDEN_RUN": "1"}
    holder = subprocess.Popen([PY, str(holder_script), str(lock)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        job = jw.start("bash", "-c", 'flock "$0" echo updating', str(lock), options=HANG)["id"]
        try:
            f = wait_chain(jw, job)
            assert f["pids"][0] == holder.pid, f
            me = pwd.getpwuid(os.geteuid()).pw_name
            assert f"held by pid {holder.pid} ({PY[:30]}" in f["title"], f
            assert f["title"].endswith(f"), user {me}, not a job of yours"), f
        finally:
            jw("stop", str(job), check=True)
    finally:
        holder.kill()
        holder.wait(30)
        assert holder.stdout is not None
        holder.stdout.close()
        jw("stop", str(sleeper), check=True)

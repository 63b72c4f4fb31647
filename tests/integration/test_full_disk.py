"""A full disk under the logs: the job keeps running, the episode is recorded, nothing is lost."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.store import Store
from jobwarden.store.reserve import reserve_path
from tests.conftest import Jobwarden, make_fifo, read_fifo, wait_pid_gone
from tests.support import unavailable

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]
TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")

# The job fills the disk through its own output, keeps it full for a few of the shim's 1 s ticks (the
# job's sleep, not the test's), frees it, writes once more and exits 0.
FILLER = r"""
import os, sys, time
chunk = b"x" * 65536 + b"\n"
filled = 0
try:
    while True:
        os.write(1, chunk)
        filled += len(chunk)
except OSError as err:
    full_error = err.strerror
time.sleep(3.5)
os.remove(sys.argv[1])
print(f"after the disk filled ({full_error}) and emptied, still here", flush=True)
"""


@pytest.fixture
def small_home(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        unavailable(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_full_log_disk_is_recorded_and_the_job_finishes(jw: Jobwarden, small_home: Path) -> None:
    jw.home = small_home / "home"
    jw.env["JOBWARDEN_HOME"] = str(jw.home)
    ballast = small_home / "ballast"  # room the job frees to let the disk recover
    ballast.write_bytes(os.urandom(1 << 20))

    result = jw("run", "--wait", "--", sys.executable, "-c", FILLER, str(ballast))

    assert result.returncode == 0, result.stderr
    job_id = result.stdout.split()[0]
    status = jw.status(job_id)
    assert (status["state"], status["exit_code"]) == ("succeeded", 0)
    log = (jw.home / "jobs" / job_id / "run-1" / "output.log").read_bytes()
    assert log.endswith(b"and emptied, still here\n")
    assert b"No space left on device" in log
    text = jw("status", job_id).stdout
    assert "the disk holding the log filled up" in text
    (finding,) = [f for f in jw.json("explain", job_id)["findings"] if f["rule"] == "disk-full"]
    assert finding["title"].endswith("output was dropped") and str(jw.home) in finding["summary"]


def test_ps_says_the_disk_is_full_and_which_end_waits_to_be_recorded(
    jw: Jobwarden, small_home: Path, tmp_path: Path
) -> None:
    jw.home = small_home / "home"
    jw.env["JOBWARDEN_HOME"] = str(jw.home)
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")  # off the small disk
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
    read_fifo(ready)
    with Store(jw.home) as store:
        reserve = reserve_path(store.layout.database, job["id"], 1)
    # as if the run had started on a disk without room for its reserve: once the disk is full, its end
    # has nowhere to go (with a reserve, the shim frees it for the end: the test after this one)
    reserve.unlink()
    ballast = small_home / "ballast"
    with ballast.open("wb") as fh, contextlib.suppress(OSError):
        while True:  # fill the disk to its last byte
            fh.write(b"\0" * 65536)
            fh.flush()
    try:
        fd = os.pidfd_open(job["pid"])
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)
        wait_pid_gone(job["pid"])
        listed = jw("ps")
        assert "WARNING: the disk holding" in listed.stderr and "is full" in listed.stderr
        assert "running (ended, not yet recorded)" in listed.stdout
    finally:
        ballast.unlink()
    assert jw("wait", str(job["id"])).returncode == 128 + signal.SIGKILL  # recorded once there was room
    assert jw("ps", "--all").stderr == ""


# The job fills the disk through its own output and exits, leaving it full: nothing frees any room
FILL_AND_LEAVE = r"""
import os
chunk = b"y" * 65536 + b"\n"
try:
    while True:
        os.write(1, chunk)
except OSError:
    pass
"""


def test_a_job_that_leaves_the_disk_full_still_gets_its_end_recorded_and_explained(
    jw: Jobwarden, small_home: Path
) -> None:
    # before: the shim could write nothing any more, and the run stayed `running` for ever with its main
    # process dead; the space reserve (store.reserve) is freed for the end
    jw.home = small_home / "home"
    jw.env["JOBWARDEN_HOME"] = str(jw.home)
    job = jw.start(sys.executable, "-c", FILL_AND_LEAVE)
    result = jw("wait", "--timeout", "60s", str(job["id"]))
    assert result.returncode == 0, result.stderr
    status = jw.status(job["id"])
    assert (status["state"], status["exit_code"]) == ("succeeded", 0)
    log = jw.home / "jobs" / str(job["id"]) / "run-1" / "output.log"
    assert log.stat().st_size > 4 << 20  # it wrote until the 8 MiB disk had no room left
    (finding,) = [f for f in jw.json("explain", str(job["id"]))["findings"] if f["rule"] == "disk-full"]
    assert finding["evidence"][0].startswith("output lost: no space left on device under ")
    assert not list(jw.home.glob(".jobwarden.db.reserve-*")), "the reserve outlived the run"


# The job fills the disk through its own output and fails on it, as most programs do on ENOSPC: exit 1
FILL_AND_FAIL = r"""
import os, sys
chunk = b"z" * 65536 + b"\n"
try:
    while True:
        os.write(1, chunk)
except OSError:
    sys.exit(1)
"""


def test_a_job_that_fails_on_the_full_disk_is_explained_by_it(jw: Jobwarden, small_home: Path) -> None:
    # before: "exited with code 1, no clearer sign why" first, and the disk-full warning after it said
    # "the job itself ran on"
    jw.home = small_home / "home"
    jw.env["JOBWARDEN_HOME"] = str(jw.home)
    job = jw.start(sys.executable, "-c", FILL_AND_FAIL)
    assert jw("wait", "--timeout", "60s", str(job["id"])).returncode == 1
    explained = jw.json("explain", str(job["id"]))
    assert (explained["state"], explained["exit_code"]) == ("failed", 1)
    root = explained["findings"][0]
    assert root["rule"] == "disk-full" and root["severity"] == "error", explained["findings"]
    assert "ran on" not in root["summary"] and str(jw.home) in root["summary"]
    assert "exit-code" not in [f["rule"] for f in explained["findings"]]
    assert "The job failed while the disk holding its log was full" in jw("status", str(job["id"])).stdout

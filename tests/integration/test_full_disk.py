"""A full disk under the logs: the job keeps running, the episode is recorded, nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Jobwarden

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

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
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
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

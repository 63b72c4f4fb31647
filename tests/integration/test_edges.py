"""The edges of issue 10, Part B: each test here failed before its fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo

pytestmark = pytest.mark.integration
TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")


def test_an_env_secret_is_never_on_the_supervisors_command_line(jw: Jobwarden, tmp_path: Path) -> None:
    # /proc/PID/cmdline is readable by every local user; the shim is forked from the CLI and used to
    # keep its argv, `--env TOKEN=...` included, for the job's whole life
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    secret = "hunter2-not-for-your-eyes"
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1", options=("--env", f"TOKEN={secret}"))
    read_fifo(ready)
    try:
        shim = jw.status(job["id"])["shim_pid"]
        cmdline = Path(f"/proc/{shim}/cmdline").read_bytes()
        assert secret.encode() not in cmdline
        assert cmdline.startswith(b"jobwarden shim")
        assert secret not in jw("status", str(job["id"])).stdout
    finally:
        write_fifo(go, "0 0\n")
    assert jw("wait", str(job["id"])).returncode == 0

"""Forking a shim before its job is recorded: whatever becomes of it before it reports, the CLI says so
and reaps it. Real forks; the shim's work is replaced where a test needs it to fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobwarden.control import shimproc
from jobwarden.errors import ShimStartFailed


def reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_shim_never_handed_its_job_exits_and_is_reaped(tmp_path: Path) -> None:
    with shimproc.fork_shim(tmp_path / "home", "launch") as shim:
        pid = shim.pid
    assert reaped(pid)


def test_a_shim_that_dies_before_reporting_is_named_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shimproc, "_shim_main", lambda home, mode, job_fd, report_fd: 3)
    with (
        pytest.raises(ShimStartFailed, match="exited before starting it") as failed,
        shimproc.fork_shim(tmp_path / "home", "launch") as shim,
    ):
        pid = shim.pid
        shim.start(7, 1)
    assert failed.value.remedy == f"see {tmp_path}/home/jobs/7/run-1/shim.log"
    assert reaped(pid)

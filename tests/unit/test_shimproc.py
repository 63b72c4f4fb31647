"""Forking a shim before its job is recorded: whatever becomes of it before it reports, the CLI says so
and reaps it. Real forks; the shim's work is replaced where a test needs it to fail."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.control import shimproc
from jobwarden.control.launch import launch
from jobwarden.errors import ShimExited, ShimStartFailed
from jobwarden.joboptions import JobOptions
from jobwarden.model import EndReason, JobSpec, JobState
from jobwarden.store import Store


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
    # it died before it had a log of its own: its traceback, if any, went to the CLI's terminal
    assert failed.value.remedy == "its error, if it printed one, is above"
    assert reaped(pid)


def test_a_run_whose_shim_died_before_starting_it_is_recorded_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not left `starting` until the run is found `lost`: the CLI still holds the store, and says so."""
    monkeypatch.setattr(shimproc, "_shim_main", lambda home, mode, job_fd, report_fd: 3)
    home = tmp_path / "home"
    with pytest.raises(ShimExited):
        launch(home, JobSpec(("true",), str(tmp_path), "t"), JobOptions())
    with Store(home) as store:
        run = store.run(1)
    assert (run.state, run.end_reason) == (JobState.FAILED, EndReason.SUPERVISOR_FAILED)
    assert run.error is not None and "exited before starting it" in run.error


def test_a_shim_survives_a_cli_interrupted_while_it_starts_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C on `run` after the handover: the shim's report meets a closed pipe. That must be an error
    it handles, not a SIGPIPE that kills it and leaves the job unsupervised; and the CLI must not wait
    for the shim, which now owns the job."""
    survived = tmp_path / "survived"

    def shim_main(home: Path, mode: str, job_fd: int, report_fd: int) -> int:
        shimproc._read_line(job_fd)
        poller = select.poll()
        poller.register(report_fd, select.POLLERR)
        poller.poll(60_000)  # until the CLI has closed its end
        try:
            os.write(report_fd, b"{}\n")
        except BrokenPipeError:
            survived.write_text("EPIPE")
        return 0

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(shimproc, "_shim_main", shim_main)
    monkeypatch.setattr(shimproc, "_read_report", interrupted)
    with pytest.raises(KeyboardInterrupt), shimproc.fork_shim(tmp_path / "home", "launch") as shim:
        pid = shim.pid
        shim.start(7, 1)
    _, status = os.waitpid(pid, 0)  # the CLI left it alone: it is this test's to reap
    assert os.WIFEXITED(status), f"the shim died of signal {os.WTERMSIG(status)}"
    assert survived.read_text() == "EPIPE"


@pytest.fixture
def sigchld_ignored() -> Iterator[None]:
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGCHLD, previous)


@pytest.mark.usefixtures("sigchld_ignored")
def test_a_cli_started_with_sigchld_ignored_leaves_nothing_to_reap(tmp_path: Path) -> None:
    """Some daemons and CI runners pass SIGCHLD ignored on to what they start: the kernel then reaps
    children itself, and waiting for one fails. The abandoned shim must not turn that into an error."""
    with shimproc.fork_shim(tmp_path / "home", "launch") as shim:
        pid = shim.pid
    assert reaped(pid)

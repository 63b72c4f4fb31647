"""`podman stop` (as `docker stop` and the kubelet's pod deletion: SIGTERM to the container's PID 1, SIGKILL
at the end of the stop timeout) is an engine stop of the job inside the timeout: the job's SIGTERM handler
runs, a quiet job's stacks are kept, the end is recorded `cancelled-by-engine`, never `lost`; with and
without a handler, with and without an init (podman's catatonit, and tini as `docker run --init` has it)."""

from __future__ import annotations

import time

import pytest

from tests.conftest import make_fifo, read_fifo
from tests.support import eventually

from .conftest import Box
from .helpers import add_job, data, ended, events, rules

pytestmark = [pytest.mark.integration, pytest.mark.container]

TINI = "/usr/bin/tini-static"  # what docker run --init runs (docker-init is tini, static)
STOP_TIMEOUT_S = 6  # the runtime's: podman stop -t 6; the container is told with JOBWARDEN_STOP_TIMEOUT


def _started(box: Box, mode: str, init: str | None = None, hang: str = "2s"):  # type: ignore[no-untyped-def]
    """A container whose job waits quietly (waiter.py MODE), started, with the hang judged: quiet, so the
    stop keeps its stacks first."""
    make_fifo(box.tmp / "ready")
    container = box.entrypoint(
        "--hang-timeout",
        hang,
        "--",
        "python3",
        add_job(box.tmp, "waiter.py"),
        mode,
        env={"JOBWARDEN_STOP_TIMEOUT": str(STOP_TIMEOUT_S)},
        init=init,
    )
    container.start()
    read_fifo(box.tmp / "ready")
    eventually("no hang judged", lambda: data(events(box.home), "hung"), 60, every_s=0.2)
    return container


def _stopped_as_engine_stop(box: Box, signal_name: str | None) -> None:
    run, found, stacks = ended(box.home)
    assert str(run.state) == "stopped" and run.end_reason == "engine-stop", run
    assert run.signal == signal_name
    assert "cancelled-by-engine" in rules(found)
    assert found[rules(found).index("cancelled-by-engine")].title.startswith(
        "Stopped by the container's runtime"
    )
    assert "engine-stop" in stacks  # where the quiet job waited, stored before it was ended
    (stop,) = [e for e in events(box.home) if e.kind == "engine-signal"]
    assert stop.data == {
        "signal": "SIGTERM",
        "action": "stop",
        "engine": "container",
        "budget_s": STOP_TIMEOUT_S,
    }


INITS = pytest.mark.parametrize("init", [None, "catatonit", TINI], ids=["pid1", "catatonit", "tini"])


@INITS
def test_a_stop_runs_the_jobs_handler_inside_the_timeout(box: Box, init: str | None) -> None:
    container = _started(box, "exit", init)
    took = container.stop(STOP_TIMEOUT_S)
    assert took < STOP_TIMEOUT_S, f"the runtime had to SIGKILL: {took:.1f}s"
    assert container.exit_code() == 0  # the job's status: its handler saved a checkpoint and exited 0
    assert (box.tmp / "term").exists()
    assert "checkpoint saved" in container.logs().stdout
    _stopped_as_engine_stop(box, None)


@INITS
def test_a_stop_ends_a_job_without_a_handler(box: Box, init: str | None) -> None:
    container = _started(box, "none", init)
    took = container.stop(STOP_TIMEOUT_S)
    assert took < STOP_TIMEOUT_S, f"the runtime had to SIGKILL: {took:.1f}s"
    assert container.exit_code() == 143
    _stopped_as_engine_stop(box, "SIGTERM")


def test_a_job_that_ignores_sigterm_is_killed_before_the_runtime_kills_everything(box: Box) -> None:
    """The grace fits what is left of the stop timeout: jobwarden's SIGKILL comes first, and its record
    of the end with it."""
    container = _started(box, "ignore")
    began = time.time()
    took = container.stop(STOP_TIMEOUT_S)
    assert took < STOP_TIMEOUT_S, f"the runtime had to SIGKILL: {took:.1f}s"
    assert container.exit_code() == 137  # the job's own status: SIGKILLed by jobwarden
    _stopped_as_engine_stop(box, "SIGKILL")
    (end,) = [e for e in events(box.home) if e.kind == "ended"]
    assert end.at - began < STOP_TIMEOUT_S
    _, found, _ = ended(box.home)
    remedy = found[rules(found).index("cancelled-by-engine")].remedy
    assert "JOBWARDEN_STOP_TIMEOUT" in remedy and "terminationGracePeriodSeconds" in remedy

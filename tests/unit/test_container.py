"""The container engine's logic: when `run` is a container's entrypoint, the stop timeout it takes as its
budget, the options it implies, and the init's reaping (real processes: it is the OS seam itself)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.control.attached import container_budget_s, engine_budget_s
from jobwarden.control.engine import container_entrypoint, detect_engine
from jobwarden.control.options import engine_options, run_options
from jobwarden.errors import UsageError
from jobwarden.model import JobState
from jobwarden.osapi import container
from jobwarden.osapi.container import ContainerFacts, container_facts
from jobwarden.store import RunRecord

PID1 = ContainerFacts(("/.dockerenv",), 1, 0)
UNDER_TINI = ContainerFacts(("/run/.containerenv",), 7, 1)
IN_A_SHELL = ContainerFacts(("KUBERNETES_SERVICE_HOST",), 412, 398)  # a notebook's `!jobwarden run`
EXECED = ContainerFacts(("/.dockerenv",), 30, 0)  # `docker exec c jobwarden run ...`
BARE_NAMESPACE = ContainerFacts((), 1, 0)  # unshare --pid --fork: no runtime's markers
HOST = ContainerFacts((), 4242, 4100)


def run_record(state: JobState, **fields: object) -> RunRecord:
    """A run as the store would give it back; `fields` change what the test is about."""
    base: dict[str, object] = {
        "job_id": 1,
        "n": 1,
        "state": state,
        "shim_pid": 2,
        "shim_start": 1,
        "pid": 3,
        "pid_start": 1,
        "started_at": 1_700_000_000.0,
        "ended_at": 1_700_000_090.0,
        "exit_code": None,
        "signal": None,
        "wait_status": None,
        "end_reason": None,
        "error": None,
        "stop_requested_at": None,
        "stop_grace": None,
        "containment": None,
        "orphans_left": [],
        "survivors": [],
    }
    return RunRecord(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "engine"),
    [
        (PID1, "container"),
        (UNDER_TINI, "container"),
        (BARE_NAMESPACE, "container"),
        (IN_A_SHELL, None),
        (EXECED, None),
        (HOST, None),
        (ContainerFacts((), 9, 1), None),  # a child of the host's init is not in a container
    ],
)
def test_a_container_is_the_engine_only_for_its_main_process(
    facts: ContainerFacts, engine: str | None
) -> None:
    assert detect_engine("auto", {}, facts) == engine
    assert container_entrypoint({}, facts) == (engine == "container")


def test_slurm_and_ray_come_before_the_container() -> None:
    """pyxis/enroot and KubeRay run their tasks in containers: the signals are Slurm's, Ray's."""
    assert detect_engine("auto", {"SLURM_JOB_ID": "7"}, PID1) == "slurm"
    assert detect_engine("auto", {"RAY_RAYLET_PID": "12"}, PID1) == "ray"
    assert detect_engine("none", {}, PID1) is None
    assert detect_engine("container", {}, HOST) == "container"
    with pytest.raises(UsageError, match="--engine 'docker'"):
        detect_engine("docker", {}, HOST)


def test_the_markers_are_the_runtimes_files_and_the_kubelets_variable(tmp_path: Path) -> None:
    assert container_facts({}, str(tmp_path)).markers == ()
    (tmp_path / "run").mkdir()
    (tmp_path / "run/.containerenv").write_text('engine="podman-4.3.1"\n')
    (tmp_path / ".dockerenv").touch()
    facts = container_facts({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, str(tmp_path))
    assert facts.markers == ("/.dockerenv", "/run/.containerenv", "KUBERNETES_SERVICE_HOST")
    assert facts.inside
    assert (facts.pid, facts.ppid) == (os.getpid(), os.getppid())


def test_the_budget_is_the_stop_timeout() -> None:
    assert container_budget_s({}) == 10.0  # docker stop, podman stop
    assert (
        container_budget_s({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == 30.0
    )  # terminationGracePeriodSeconds
    assert container_budget_s({"JOBWARDEN_STOP_TIMEOUT": "60", "KUBERNETES_SERVICE_HOST": "x"}) == 60.0
    assert container_budget_s({"JOBWARDEN_STOP_TIMEOUT": "2m"}) == 120.0
    assert engine_budget_s("container", {"JOBWARDEN_STOP_TIMEOUT": "45s"}) == 45.0


@given(st.text(max_size=30))
def test_a_stop_timeout_is_a_positive_duration_or_a_one_line_error_naming_the_variable(text: str) -> None:
    try:
        budget = container_budget_s({"JOBWARDEN_STOP_TIMEOUT": text})
    except UsageError as err:
        assert err.message.startswith("JOBWARDEN_STOP_TIMEOUT: ") and "\n" not in err.message
    else:
        assert 0 < budget < float("inf")


def test_a_container_entrypoint_makes_no_cgroup_of_its_own_and_keeps_mem_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jobwarden.control.engine as engine_module

    monkeypatch.setattr(engine_module, "container_facts", lambda env, root="/": PID1)
    attached = engine_options({})
    assert (attached["engine"], attached["own_cgroup"]) == ("container", False)
    # --mem-limit is the RSS watchdog here (refused only under Slurm, whose --mem is the limit)
    assert run_options(mem_limit="1G", engine=attached).mem_limit_bytes == 1 << 30
    detached = engine_options({}, detach=True)
    assert (detached["engine"], detached["own_cgroup"]) == (None, True)


def test_a_failed_run_never_exits_0() -> None:
    """A job whose SIGTERM handler exits 0 after jobwarden ended it as hung has failed: the container's
    restart policy must see a failure."""
    hung = run_record(state=JobState.FAILED, exit_code=0, end_reason="hung")
    assert hung.exit_status == 1
    assert run_record(state=JobState.STOPPED, exit_code=0).exit_status == 0  # a checkpoint on a stop: fine
    assert run_record(state=JobState.SUCCEEDED, exit_code=0).exit_status == 0
    assert run_record(state=JobState.FAILED, exit_code=3).exit_status == 3


def _in_a_child(check: Callable[[], None]) -> None:
    """Run `check` in a forked child, as the container's init would be: reaping every exited child must not
    take those of the test process (a session's daemons). Its failure comes back as the child's message."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            check()
        except BaseException as err:  # any failure, reported to the parent
            os.write(write, f"{type(err).__name__}: {err}".encode())
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as report:
        message = report.read().decode()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, message


def test_the_init_reaps_every_exited_child_and_its_pidfd_still_tells_the_end() -> None:
    def check() -> None:
        kept = os.fork()
        if kept == 0:
            os._exit(5)
        pidfd = os.pidfd_open(kept)
        orphan = os.fork()
        if orphan == 0:
            os._exit(0)
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)  # both have exited, neither is reaped
        os.waitid(os.P_PID, orphan, os.WEXITED | os.WNOWAIT)
        reaped = dict(container.reap_orphans())
        assert set(reaped) == {kept, orphan}, reaped
        assert os.waitstatus_to_exitcode(reaped[kept]) == 5
        assert container.reap_orphans() == []  # nothing left, and no error without children
        container.reap_through(pidfd)  # reaped already: returns at once, never waits for another pid

    _in_a_child(check)


def test_reap_through_waits_for_the_child_the_pidfd_names() -> None:
    def check() -> None:
        child = os.fork()
        if child == 0:
            signal.pause()
            os._exit(1)
        pidfd = os.pidfd_open(child)
        os.kill(child, signal.SIGTERM)
        container.reap_through(pidfd)
        try:
            os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return
        raise AssertionError("the child was not reaped")

    _in_a_child(check)

"""What jobwarden says inside a container: the container's stop and OOM kill, named for what they are, with
remedies a container's owner can apply; and `doctor`'s account of what it sees there."""

from __future__ import annotations

import dataclasses

from jobwarden.control.doctor.checks import OK, WARN, check_containment, run_checks
from jobwarden.observations import OomEvidence
from jobwarden.rules import explain
from jobwarden.rules.evidence import RunEvidence
from tests.unit.test_doctor import facts


def _ended(**fields: object) -> RunEvidence:
    base: dict[str, object] = {
        "state": "stopped",
        "exit_code": 143,
        "signal": None,
        "end_reason": "engine-stop",
        "pid": 7,
        "engine": "container",
        "engine_budget_s": 10.0,
        "engine_signal": "SIGTERM",
        "engine_signal_at": 1_800_000_000.0,
    }
    return RunEvidence(**{**base, **fields})  # type: ignore[arg-type]


def test_a_containers_stop_is_the_runtimes_and_a_slow_job_names_the_stop_timeout() -> None:
    (finding,) = explain(_ended())
    assert finding.rule == "cancelled-by-engine"
    assert finding.title.startswith("Stopped by the container's runtime (docker stop")
    assert "kubectl describe pod" in finding.remedy and "JOBWARDEN_STOP_TIMEOUT" not in finding.remedy
    (killed,) = explain(_ended(signal="SIGKILL", exit_code=None))
    assert "terminationGracePeriodSeconds" in killed.remedy and "JOBWARDEN_STOP_TIMEOUT" in killed.remedy


def test_an_oom_kill_in_a_container_names_the_containers_limit() -> None:
    oom = OomEvidence("cgroup-v1", 1, 150 << 20, 150 << 20, (), ())
    ev = _ended(state="failed", exit_code=None, signal="SIGKILL", end_reason="signalled", oom=oom)
    finding = explain(ev)[0]
    assert finding.rule == "oom-kill"
    assert finding.title == "Killed by the kernel OOM killer: the container at its 150.0M limit"
    assert "the container's memory cgroup (v1)" in finding.summary
    assert "resources.limits.memory" in finding.remedy and "--mem-limit" not in finding.remedy
    on_a_host = explain(dataclasses.replace(ev, engine=None))[0]
    assert "--mem-limit" in on_a_host.remedy  # outside a container the job's own cgroup is jobwarden's


def test_doctor_in_a_container_says_the_oom_counters_are_read_there() -> None:
    inside = facts(
        containment=None,
        container=("/run/.containerenv",),
        pid1="jobwarden",
        pid_namespace=True,
        enclosing_oom=("cgroup-v1 /sys/fs/cgroup/memory", 150 << 20),
        kernel_log="kernel log unreadable: no /dev/kmsg here (usual in containers)",
    )
    checks = {c.name: c for c in run_checks(inside)}
    container = checks["container"]
    assert container.status == OK
    for words in (
        "/run/.containerenv",
        "PID 1 is jobwarden",
        "150.0M",
        "no /dev/kmsg",
        "no kernel process events",
    ):
        assert words in container.message, container.message
    containment = checks["containment"]
    assert containment.status == OK and "OOM kills are counted" in containment.message
    assert "unavailable" not in containment.message
    assert next(iter(checks)) == "container"  # said first: it explains the others


def test_doctor_on_a_host_without_a_writable_cgroup() -> None:
    counted = check_containment(None, False, ("cgroup-v2 /sys/fs/cgroup/user.slice", None))
    assert counted.status == WARN and "OOM kills are counted" in counted.message and counted.fix
    assert "no limit of its own" in counted.message
    bare = check_containment(None, False, None)
    assert bare.status == WARN and "cgroup OOM counters are unavailable" in bare.message
    assert "container" not in [c.name for c in run_checks(facts())]

"""What the supervisor costs its job (issue 25, "Slowness"): inside a CPU quota it shares with the job (the
CLI started in a container's --cpus or a Slurm step), no automatic profile is taken while the quota
throttles: py-spy's CPU would be the job's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from jobwarden.shim.watch.autoprofile import AutoProfiler
from jobwarden.store import Store
from jobwarden.store import profiles as stored
from tests.conftest import Jobwarden
from tests.integration.test_speed import JOB, PY, eventually, finding, quota_cgroup, ready, stop  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def run_inside(jw: Jobwarden, cgroup: Path, *command: str) -> int:
    """`jobwarden run` started inside `cgroup`, as a user's shell in a container would: the shim too."""
    line = " ".join([PY, "-m", "jobwarden", "run", "--json", "--", *command])
    inside = f"echo $$ > {cgroup}/cgroup.procs && exec {line}"
    ran = subprocess.run(["sh", "-c", inside], env=jw.env, capture_output=True, text=True, timeout=90)
    assert ran.returncode == 0, ran.stderr
    return int(json.loads(ran.stdout)["id"])


def events(jw: Jobwarden, job: int, kind: str) -> list[dict[str, object]]:
    with Store(jw.home) as store:
        return [e.data for e in store.events(job, 1) if e.kind == kind]


def test_no_automatic_profile_inside_a_throttled_quota_shared_with_the_job(
    jw: Jobwarden,
    quota_cgroup: Path,  # noqa: F811
) -> None:
    job = run_inside(jw, quota_cgroup, PY, str(JOB), "spin")
    try:
        ready(jw, job)
        eventually("cpu-throttled", lambda: finding(jw, job, "cpu-throttled"))
        skipped = eventually("the profile skipped", lambda: events(jw, job, "auto-profile-skipped"))
        assert skipped[0]["rule"] == "cpu-throttled"
        assert "quota the supervisor shares with the job" in str(skipped[0]["reason"])
        with Store(jw.home) as store:
            assert stored.listed(store.layout, job, 1) == []  # py-spy never ran
        assert events(jw, job, "auto-profile") == []
    finally:
        stop(jw, job)


class Throttled:
    def throttled(self) -> str:
        return "the 0.25-CPU quota the supervisor shares with the job (/q) throttled 9 of 10 periods"


def test_a_throttled_quota_is_said_once_and_always_takes_the_profile_with_its_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    noted: list[tuple[str, dict[str, object]]] = []
    logged: list[str] = []

    def profiler() -> AutoProfiler:
        note = lambda kind, **fields: noted.append((kind, fields))  # noqa: E731
        return AutoProfiler(tmp_path, 1, 1, time.monotonic, logged.append, note=note, quota=Throttled())

    auto = profiler()
    assert auto.start("cpu-throttled") is False and auto.child is None
    assert auto.start("slowed-down") is False  # within the interval: said once
    assert [kind for kind, _ in noted] == ["auto-profile-skipped"]
    assert "JOBWARDEN_AUTO_PROFILE=always" in logged[0]

    monkeypatch.setenv("JOBWARDEN_AUTO_PROFILE", "always")
    noted.clear()
    auto = profiler()
    try:
        assert auto.start("cpu-throttled") is True and auto.child is not None
        os.waitid(os.P_PIDFD, auto.child[1], os.WEXITED | os.WNOWAIT)  # no such job here: it ends at once
        auto.poll()
    finally:
        auto.close()
    assert [kind for kind, _ in noted] == ["auto-profile"]
    cost = noted[0][1]["cpu_s"]
    assert isinstance(cost, float) and cost > 0  # measured: an interpreter's start at least
    assert "s of CPU" in logged[-1]

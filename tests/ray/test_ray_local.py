"""A job that runs its own local Ray: jobwarden watches Ray's daemons as processes of the job, and must
never harm them (issue 20, class 1: the dump signal killed the raylet every time a worker failed)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ray.conftest import require_ray
from tests.ray.raycluster import RayNamespace

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(600)]

JOB = Path(__file__).with_name("jobs") / "local_cluster.py"


@pytest.fixture
def bare_ns() -> Iterator[RayNamespace]:
    """Namespaces of its own with no cluster in them: the job starts its Ray on their loopback."""
    require_ray()
    ns = RayNamespace(Path(sys.executable).parent)
    try:
        ns.open()
        yield ns
    finally:
        ns.close()


def test_a_lost_worker_leaves_the_jobs_own_raylet_alive(bare_ns: RayNamespace, tmp_path: Path) -> None:
    # Ray keeps a local cluster's auth token in ~/.ray: a HOME of its own, so that the session's other Ray
    # tests (a cluster of their own, with its own token) never read this one's
    env = {"JOBWARDEN_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    done = bare_ns.run(
        "jobwarden", "run", "--wait", "--engine", "none", "--", sys.executable, str(JOB), env=env, timeout=300
    )
    log = bare_ns.run("jobwarden", "logs", "1", env=env, check=True).stdout
    assert "the worker crashed" in log
    assert "local raylet died" not in log, log[-3000:]
    assert "then: 42" in log
    assert done.returncode == 0, done.stderr

"""The throwaway Slurm (tests/slurmcluster.py), one per test session, shared by every Slurm test.

Tests marked `slurm` use `slurm_cluster` (its `srun`, `srun_async`, `sbatch`, `scancel`, `wait_job`, `job`,
`env`) and run jobwarden under it with `jobwarden_argv()` and `jw_env(jw)` (the test's JOBWARDEN_HOME).
Without Slurm's packages (or root) the tests are skipped; in CI (CI=true) they fail: scripts/test installs
slurm-wlm and munge where it runs as root."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.slurmcluster import SlurmCluster, missing_tools
from tests.support import unavailable

KILL_WAIT_S = 5


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = missing_tools()
    if missing:
        unavailable(f"Slurm's tools are not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        unavailable("the throwaway Slurm needs root (slurmd, cgroups, munge's user)")
    root = Path(tempfile.mkdtemp(prefix="jw-slurm-"))  # short: munge's socket path has a length limit
    cluster = SlurmCluster(root, kill_wait=KILL_WAIT_S)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def jobwarden_argv(*args: str) -> list[str]:
    """`jobwarden ARGS` as a Slurm task runs it: the test's interpreter, so the same checkout."""
    return [sys.executable, "-m", "jobwarden", *args]


def jw_env(jw: Jobwarden) -> dict[str, str]:
    return {"JOBWARDEN_HOME": str(jw.home), "NO_COLOR": "1"}

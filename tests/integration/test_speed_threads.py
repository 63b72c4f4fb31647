"""worker-respawn and gil-bound on real running jobs (tests/integration/jobs/threads_job.py), each with its
look-alike that must stay silent: DataLoader workers kept between epochs, and threads in native code that
really use two CPUs (a torch matmul with 2 intra-op threads).

Handshakes: each job says "ready"; the loader job prints each epoch it ends, the others heartbeat their own
clock (tenths of a second): a silence is asserted only after the job ran long enough for the shim to have
judged it several times. Every job is stopped by `jobwarden stop`; the jw fixture checks nothing leaked."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401  (the realworld extra: missing, these tests fail rather than skip)

from tests.conftest import Jobwarden
from tests.integration.test_speed import explained, finding, ready, speed_findings, stop, two_cpus
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
JOB = Path(__file__).resolve().parent / "jobs" / "threads_job.py"
PY = sys.executable


def epochs(jw: Jobwarden, job: int) -> int:
    found = re.findall(r"^epoch (\d+)$", jw.output(job), re.M)
    return int(found[-1]) if found else 0


def ran_for(jw: Jobwarden, job: int, tenths: int) -> bool:
    return ((jw.status(job).get("progress") or {}).get("step") or 0) >= tenths


def test_a_dataloader_without_persistent_workers_is_worker_respawn(jw: Jobwarden) -> None:
    job = jw.start(PY, str(JOB), "loader", "0")["id"]
    try:
        ready(jw, job)
        f = eventually("worker-respawn", lambda: finding(jw, job, "worker-respawn"), 150)
        assert epochs(jw, job) >= 2, jw.output(job)  # three batches of workers: two epochs ended
        assert f["title"].startswith("DataLoader workers started anew every "), f["title"]
        assert "persistent_workers=True" in f["remedy"]
        first = f["evidence"][0]
        # 2 workers per epoch, however late the tree sees one of them (batched by their start times)
        assert re.search(
            r"started \d+ batches of 2 workers \(spawn\), each after the previous one ended", first
        )
        assert "spawn_main" in first, first
        explained(jw, job, "worker-respawn")
    finally:
        stop(jw, job)


def test_persistent_workers_are_no_worker_respawn(jw: Jobwarden) -> None:
    job = jw.start(PY, str(JOB), "loader", "1")["id"]
    try:
        ready(jw, job)
        # respawning workers are found a judgement (4 s) after their third batch, once 8 s of counters
        # exist: about 15 s into the run. 40 epochs of 0.6 s are 24 s at the least, whatever the load
        eventually("epoch 40", lambda: epochs(jw, job) >= 40, 180)
        assert finding(jw, job, "worker-respawn") is None, speed_findings(jw, job)
    finally:
        stop(jw, job)


def test_two_spinning_python_threads_are_gil_bound(jw: Jobwarden) -> None:
    two_cpus()
    job = jw.start(PY, str(JOB), "gil")["id"]
    try:
        ready(jw, job)
        f = eventually("gil-bound", lambda: finding(jw, job, "gil-bound"), 120)
        assert f["title"].startswith("2 Python threads share one CPU (the GIL)"), f["title"]
        assert "ProcessPoolExecutor" in f["remedy"]
        assert "2 busy threads used " in f["evidence"][0], f["evidence"]
        explained(jw, job, "gil-bound")
    finally:
        stop(jw, job)


def test_a_torch_matmul_on_two_threads_is_not_gil_bound(jw: Jobwarden) -> None:
    two_cpus()
    job = jw.start(PY, str(JOB), "matmul")["id"]
    try:
        ready(jw, job)
        # 40 s of its own clock: a gil-bound finding shows within ~12 s (three reads, a judgement)
        eventually("40 s of matmuls", lambda: ran_for(jw, job, 400), 150)
        assert finding(jw, job, "gil-bound") is None, speed_findings(jw, job)
    finally:
        stop(jw, job)

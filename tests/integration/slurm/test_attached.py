"""`jobwarden run` attached inside a real Slurm step (issue 12, parts 1-2): srun's exit code is the job's;
scancel ends every rank inside KillWait with its stacks, its end and `cancelled-by-engine`; SIGUSR1 (scancel
-s USR1, --signal=USR1@N) reaches the job, which runs on; an OOM under --mem stays Slurm's OUT_OF_MEMORY."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from jobwarden.store import Store
from tests.conftest import Jobwarden
from tests.slurmcluster import SlurmCluster
from tests.support import eventually

from .conftest import KILL_WAIT_S, jobwarden_argv, jw_env

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

RANK = str(Path(__file__).parent / "jobs" / "rank.py")


def _jobs(jw: Jobwarden) -> list[dict[str, Any]]:
    return list(jw.json("ps", "--all"))


def _wait_for(check: Any, timeout_s: float, what: str) -> Any:
    return eventually(what, check, timeout_s, every_s=0.05)


def _events(jw: Jobwarden, job_id: int) -> list[Any]:
    with Store(jw.home) as store:
        return store.events(job_id, 1)


def _ready(directory: Path, ranks: int) -> str | None:
    """The Slurm job id, once every rank has said it is ready."""
    files = [directory / f"ready-{r}" for r in range(ranks)]
    return files[0].read_text() if all(f.exists() and f.read_text() for f in files) else None


def _running(jw: Jobwarden, count: int) -> list[dict[str, Any]] | None:
    jobs = _jobs(jw)
    return jobs if sum(j["state"] == "running" for j in jobs) == count else None


@pytest.mark.parametrize(
    ("script", "status"), [("echo out; exit 0", 0), ("echo out; exit 3", 3), ("echo out; kill -9 $$", 137)]
)
def test_srun_exits_with_the_jobs_status(
    slurm_cluster: SlurmCluster, jw: Jobwarden, script: str, status: int
) -> None:
    done = slurm_cluster.srun("-n1", *jobwarden_argv("run", "--", "sh", "-c", script), env=jw_env(jw))
    assert done.returncode == status, done.stderr
    assert done.stdout == "out\n"  # the job's output, through the attached CLI; no job id in it
    (job,) = _jobs(jw)
    assert job["state"] == ("succeeded" if status == 0 else "failed")
    assert jw.status(job["id"])["containment"].startswith("subreaper")  # no memory cgroup under Slurm


def test_scancel_ends_every_rank_inside_killwait_with_stacks(
    slurm_cluster: SlurmCluster, jw: Jobwarden, tmp_path: Path
) -> None:
    env = {**jw_env(jw), "READY_DIR": str(tmp_path), "IGNORE_TERM": "1"}  # rank 1 must be SIGKILLed
    argv = jobwarden_argv("run", "--hang-timeout", "2s", "--grace", "30s", "--", "python3", RANK)
    srun = slurm_cluster.srun_async("-n2", *argv, env=env)
    try:
        slurm_job = _wait_for(lambda: _ready(tmp_path, 2), 60, "the ranks are not ready")
        jobs = _wait_for(lambda: _running(jw, 2), 30, "not 2 runs running")
        # quiet: the hang window (2 s) passed for both, so the engine's stop takes their stacks first
        for job in jobs:
            _wait_for(lambda j=job: any(e.kind == "hung" for e in _events(jw, j["id"])), 30, "no hang judged")
        cancelled_at = time.time()
        slurm_cluster.scancel(slurm_job)
        out, err = srun.communicate(timeout=60)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    assert srun.returncode == 143, err  # rank 0's SIGTERM; rank 1's SIGKILL (137) is lower
    assert "rank 0 stopping" in out
    for job in jobs:
        events = {e.kind: e for e in _events(jw, job["id"])}
        assert events["engine-signal"].data == {
            "signal": "SIGTERM",
            "action": "stop",
            "engine": "slurm",
            "budget_s": float(KILL_WAIT_S),
        }
        # inside KillWait: Slurm never had to SIGKILL the shim
        assert events["ended"].at - cancelled_at < KILL_WAIT_S, events["ended"].at - cancelled_at
        with Store(jw.home) as store:
            assert "engine-stop" in [dump.trigger for dump in store.stacks(job["id"], 1)]
        explained = jw.json("explain", str(job["id"]))
        assert explained["state"] == "stopped"
        rules = [f["rule"] for f in explained["findings"]]
        # the hang judged before (no-progress) comes first as a cause; the end is the engine's
        assert rules == ["no-progress", "cancelled-by-engine"], rules
        assert explained["findings"][1]["title"] == "Cancelled by Slurm (scancel)"
    signals = sorted(jw.status(job["id"])["signal"] or "exit" for job in jobs)
    assert signals == ["SIGKILL", "exit"]  # rank 1 ignored SIGTERM: killed after the grace that fits


def test_scancel_usr1_reaches_the_job_which_runs_on(
    slurm_cluster: SlurmCluster, jw: Jobwarden, tmp_path: Path
) -> None:
    env = {**jw_env(jw), "READY_DIR": str(tmp_path)}
    srun = slurm_cluster.srun_async("-n2", *jobwarden_argv("run", "--", "python3", RANK), env=env)
    try:
        slurm_job = _wait_for(lambda: _ready(tmp_path, 2), 60, "the ranks are not ready")
        slurm_cluster.scancel("-s", "USR1", slurm_job)
        out, err = srun.communicate(timeout=60)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    assert srun.returncode == 0, err
    assert "rank 0 got SIGUSR1" in out and "rank 1 ran on" in out
    for job in _jobs(jw):
        assert job["state"] == "succeeded"
        forwarded = [e.data for e in _events(jw, job["id"]) if e.kind == "engine-signal"]
        assert forwarded == [{"signal": "SIGUSR1", "action": "forwarded", "pid": job["pid"]}]


@pytest.mark.timeout(180)  # Slurm may send the signal up to 60 s late
def test_signal_usr1_before_the_time_limit_reaches_the_job(
    slurm_cluster: SlurmCluster, jw: Jobwarden, tmp_path: Path
) -> None:
    # --time=1 --signal=USR1@55: due 5 s after the start; Slurm may send it up to 60 s late (seen: +18 s)
    output = tmp_path / "slurm.out"
    argv = " ".join(jobwarden_argv("run", "--", "python3", RANK))
    script = f"#!/bin/sh\nsrun -n1 {argv}\n"
    env = {**jw_env(jw), "READY_DIR": str(tmp_path)}
    job = slurm_cluster.sbatch(script, "--time=1", "--signal=USR1@55", f"--output={output}", env=env)
    ended = slurm_cluster.wait_job(job, timeout_s=110)
    assert ended["JobState"] == "COMPLETED" and ended["ExitCode"] == "0:0", ended
    text = output.read_text()
    assert "rank 0 got SIGUSR1" in text and "rank 0 ran on" in text, text
    (run,) = _jobs(jw)
    assert run["state"] == "succeeded"


def test_an_oom_under_mem_stays_slurms_out_of_memory(slurm_cluster: SlurmCluster, jw: Jobwarden) -> None:
    hog = "b = []\nwhile True: b.append(bytearray(50 << 20))"
    argv = jobwarden_argv("run", "--", "python3", "-c", hog)
    done = slurm_cluster.srun("--mem=150M", "-n1", "--job-name=jw-oom", *argv, env=jw_env(jw))
    assert done.returncode != 0
    (job,) = _jobs(jw)
    (ended,) = _wait_for(
        lambda: [r for r in slurm_cluster.jobcomp() if r.get("Name") == "jw-oom"], 30, "no jobcomp record"
    )
    assert ended["JobState"] == "OUT_OF_MEMORY", ended
    explained = jw.json("explain", str(job["id"]))
    assert explained["findings"][0]["rule"] == "oom-kill", explained


def test_mem_limit_under_slurm_names_slurms_mem(slurm_cluster: SlurmCluster, jw: Jobwarden) -> None:
    done = slurm_cluster.srun(
        "-n1", *jobwarden_argv("run", "--mem-limit", "1G", "--", "true"), env=jw_env(jw)
    )
    assert done.returncode == 2, done.stderr
    assert "--mem-limit" in done.stderr and "--mem=" in done.stderr
    assert "Traceback" not in done.stderr

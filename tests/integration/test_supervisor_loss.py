"""A shim's death never kills or blocks the job; the job shows `lost` and can be adopted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobwarden.control.views.joblist import lost_at_start
from jobwarden.model import JobSpec, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import HOME_ENV, JOB_ID_ENV, RUN_ENV
from jobwarden.store import Store
from tests.conftest import (
    Jobwarden,
    kill_shim,
    make_fifo,
    processes_under,
    read_fifo,
    wait_pid_gone,
    write_fifo,
)
from tests.support import eventually

pytestmark = pytest.mark.integration
TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _start_ticker(jw: Jobwarden, tmp_path: Path, first: int = 100) -> tuple[dict, Path]:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), str(first))
    assert int(read_fifo(ready)) == job["pid"]
    return job, go


def test_killed_shim_loses_no_output_and_shows_lost(jw: Jobwarden, tmp_path: Path) -> None:
    job, go = _start_ticker(jw, tmp_path)
    kill_shim(jw, job["id"])

    status = jw.status(job["id"])
    assert status["state"] == "lost"
    assert [p["pid"] for p in status["processes"]] == [job["pid"]]
    assert any(f["rule"] == "supervisor-lost" for f in status["findings"])
    assert [j["state"] for j in jw.json("ps")] == ["lost"]

    write_fifo(go, "50 0\n")  # the job carries on unsupervised and writes 50 more lines
    wait_pid_gone(job["pid"])
    assert jw.output(job["id"]).splitlines() == [f"line {i}" for i in range(150)]
    final = jw.status(job["id"])
    assert final["state"] == "lost"
    if final["containment"].startswith("cgroup-"):  # the dead shim's cgroup is released once empty
        assert not Path(final["containment"].split(" ", 1)[1]).exists()


def test_adopted_job_records_its_exit_status(jw: Jobwarden, tmp_path: Path) -> None:
    job, go = _start_ticker(jw, tmp_path)
    kill_shim(jw, job["id"])

    adopted = jw.json("adopt", str(job["id"]))
    assert adopted["pids"] == [job["pid"]]
    assert jw.status(job["id"])["state"] == "running"

    write_fifo(go, "5 7\n")
    assert jw("wait", str(job["id"])).returncode == 7
    status = jw.status(job["id"])
    # PIDFD_INFO_EXIT (Linux >= 6.15) gives the status of a process we are not the parent of
    if _kernel() >= (6, 15):
        assert (status["state"], status["exit_code"]) == ("failed", 7)
    else:
        assert status["state"] in ("failed", "lost")


def test_stop_on_a_lost_job_ends_its_processes(jw: Jobwarden, tmp_path: Path) -> None:
    job, _go = _start_ticker(jw, tmp_path)
    kill_shim(jw, job["id"])
    assert jw.status(job["id"])["state"] == "lost"

    result = jw.json("stop", str(job["id"]), "--grace", "5s")

    assert result["state"] == "stopped"
    assert result["survivors"] == []
    wait_pid_gone(job["pid"], timeout_s=5)


def test_concurrent_adopts_start_one_supervisor(jw: Jobwarden, tmp_path: Path) -> None:
    job, go = _start_ticker(jw, tmp_path)
    kill_shim(jw, job["id"])
    adopts = [
        subprocess.Popen(
            [sys.executable, "-m", "jobwarden", "adopt", str(job["id"])],
            env=jw.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [(p.wait(timeout=90), *p.communicate()) for p in adopts]
    assert sorted(code for code, _, _ in results) == [0, 1, 1], results
    for code, _, err in results:
        if code:
            assert "being adopted by another" in err or "only a lost job" in err, err
            assert "Traceback" not in err
    shims = [
        pid
        for pid in processes_under(jw.home)
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"jobwarden shim")
    ]
    assert len(shims) == 1
    write_fifo(go, "0 0\n")
    assert jw("wait", str(job["id"])).returncode == 0


def test_a_job_that_kills_its_shim_at_once_is_recorded_as_started_and_lost(
    jw: Jobwarden, tmp_path: Path
) -> None:
    # its first act: before the shim has recorded the start (or answered `run`), it is gone
    ready = make_fifo(tmp_path / "ready")
    script = f'kill -9 "$JOBWARDEN_SHIM_PID"; echo $$ > {ready}; exec sleep 300'
    run = jw("run", "--", "sh", "-c", script)
    pid = int(read_fifo(ready))
    assert "Traceback" not in run.stderr
    assert "never" not in run.stderr and "before starting it" not in run.stderr, run.stderr
    status = jw.status("1")
    assert (status["state"], status["pid"]) == ("lost", pid), status
    assert status["started_at"] is not None
    assert any(f["rule"] == "supervisor-lost" for f in status["findings"])
    assert jw.json("adopt", "1")["pids"] == [pid]
    assert jw.json("stop", "1", "--grace", "5s")["state"] == "stopped"
    wait_pid_gone(pid, timeout_s=5)


def test_a_run_whose_shim_died_unrecorded_is_found_by_its_markers(jw: Jobwarden) -> None:
    # the same, without the race: the shim died before it recorded anything, and the job runs
    with Store(jw.home) as store:
        job_id, n = store.create_job(JobSpec(("sleep", "300"), "/", "sleeper"), {}, time.time())
        markers = {HOME_ENV: str(jw.home), JOB_ID_ENV: str(job_id), RUN_ENV: str(n)}
        job = subprocess.Popen(["sleep", "300"], env={**os.environ, **markers}, start_new_session=True)
        try:
            assert lost_at_start(store, ProcFS(), store.job(job_id), n) == job.pid
            run = store.run(job_id, n)
            assert (run.state, run.pid) == (JobState.LOST, job.pid)
            assert run.started_at is not None and abs(run.started_at - time.time()) < 60
            assert [e.kind for e in store.events(job_id, n)][-2:] == ["started", "supervisor-lost"]
        finally:
            job.kill()
            job.wait()


def _lost_in_backoff(jw: Jobwarden, script: str, opts: tuple[str, ...]) -> dict:
    """A job whose run 1 failed and whose shim is SIGKILLed while it waits out the backoff before run 2."""
    job = jw.start("sh", "-c", script, options=(*opts, "--restart-delay", "1h"))
    # run 1 ended; its shim waits out the hour
    eventually("the job restarting", lambda: jw.status(job["id"])["state"] == "restarting", 60, every_s=0.05)
    kill_shim(jw, job["id"])
    return job


def test_a_supervisor_killed_in_the_restart_backoff_is_adopted_and_the_restart_carries_on(
    jw: Jobwarden, tmp_path: Path
) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    # run 1 fails at once; run 2 says so, then fails too once let go
    script = f'[ "$JOBWARDEN_RUN" = 1 ] && exit 3; echo "$JOBWARDEN_RUN" > {ready}; read x < {go}; exit 4'
    job = _lost_in_backoff(jw, script, ("--restart", "on-failure", "--max-restarts", "1"))
    lost = jw.status(job["id"])
    assert (lost["state"], lost["run"], lost["pid"]) == ("lost", 2, None)
    said = jw.json("explain", str(job["id"]))["findings"][0]
    assert said["rule"] == "supervisor-lost" and "ran on unsupervised" not in json.dumps(said), said
    assert "during the restart backoff" in said["title"] and "nothing of the job ran" in said["summary"]
    assert f"jobwarden adopt {job['id']}" in said["remedy"]

    adopted = jw.json("adopt", str(job["id"]))  # carries on with the pending restart: run 2 starts now
    assert read_fifo(ready) == "2\n"
    status = jw.status(job["id"])
    assert (status["state"], status["run"], status["pid"]) == ("running", 2, adopted["pid"])
    explained = jw.json("explain", str(job["id"]))
    text = json.dumps(explained["findings"])
    assert "ran on unsupervised" not in text and "during the restart backoff" in text, text
    write_fifo(go)
    # the restart count it had: --max-restarts 1 was spent on run 2, so its failure is the end
    assert jw("wait", str(job["id"])).returncode == 4
    with Store(jw.home) as store:
        assert [(r.n, r.state, r.exit_code) for r in store.runs(job["id"])] == [
            (1, "failed", 3),
            (2, "failed", 4),
        ]
        assert "not-restarted" in [e.kind for e in store.events(job["id"], 2)]


def test_stop_calls_off_the_restart_a_supervisor_died_waiting_to_make(jw: Jobwarden) -> None:
    job = _lost_in_backoff(jw, "exit 3", ("--restart", "always"))
    assert jw.status(job["id"])["state"] == "lost"
    stopped = jw.json("stop", str(job["id"]))
    assert (stopped["state"], stopped["run"], stopped["already_ended"]) == ("stopped", 2, False)
    cause = jw.json("explain", str(job["id"]))["findings"][0]
    assert cause["rule"] == "stopped-by-user" and "before this run's process was started" in cause["summary"]
    refused = jw("adopt", str(job["id"]))
    assert refused.returncode == 1 and "only a lost job" in refused.stderr
    with Store(jw.home) as store:
        assert [r.state for r in store.runs(job["id"])] == ["failed", "stopped"]

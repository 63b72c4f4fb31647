"""How an ended attempt looks to the restart policy (shim.run.attempts.outcome_of), read from a real store."""

from __future__ import annotations

from pathlib import Path

from jobwarden.model import EndReason, JobSpec, JobState
from jobwarden.shim.run.attempts import outcome_of
from jobwarden.store import Store

NOW = 1_700_000_000.0


def test_an_attempt_knows_how_long_it_ran(tmp_path: Path) -> None:
    with Store(tmp_path / "home") as store:
        job_id, n = store.create_job(JobSpec(("python", "t.py"), "/", "t"), {}, NOW)
        store.update_run(
            job_id,
            n,
            state=JobState.FAILED,
            started_at=NOW,
            ended_at=NOW + 3600,
            exit_code=1,
            end_reason=EndReason.EXITED,
        )
        outcome = outcome_of(store, store.job(job_id), store.run(job_id, n), hung_restart=False)
        assert (outcome.state, outcome.exit_code, outcome.ran_s) == ("failed", 1, 3600.0)


def test_an_attempt_that_never_started_has_no_running_time(tmp_path: Path) -> None:
    with Store(tmp_path / "home") as store:
        job_id, n = store.create_job(JobSpec(("python", "t.py"), "/", "t"), {}, NOW)
        store.update_run(job_id, n, state=JobState.STOPPED, ended_at=NOW, end_reason=EndReason.STOPPED)
        outcome = outcome_of(store, store.job(job_id), store.run(job_id, n), hung_restart=False)
        assert outcome.ran_s is None and outcome.stopped_by_user

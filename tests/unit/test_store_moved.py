"""A long-lived connection (a shim's) of a database that was moved aside never reopens the new database
made in its place: job ids start over there, and its writes would land on another job (an old job's end
recorded as the new job's). It did, whenever the shim ticked between the move and its run's end."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from jobwarden.model import JobSpec, JobState
from jobwarden.store import Store

NOW = 1_700_000_000.0


def test_a_moved_database_is_never_swapped_for_the_new_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = Store(home)
    job_id, run = old.create_job(JobSpec(("train",), "/", "old"), {}, NOW)
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("jobwarden.db", "jobwarden.db-wal", "jobwarden.db-shm", "jobs"):
        if (home / name).exists():
            (home / name).rename(aside / name)
    with Store(home) as new:  # job ids start over: the same id, another job
        assert new.create_job(JobSpec(("serve",), "/", "new"), {}, NOW) == (job_id, run)
        assert old.reopen_if_wal_replaced() is False
        old.update_run(job_id, run, state=JobState.SUCCEEDED, exit_code=0)
        assert new.run(job_id, run).state != JobState.SUCCEEDED  # the old shim's end stays its own
    old.close()
    with sqlite3.connect(aside / "jobwarden.db") as moved:  # the moved file holds the old job's end
        (state,) = moved.execute(
            "SELECT state FROM runs WHERE job_id = ? AND n = ?", (job_id, run)
        ).fetchone()
    moved.close()
    assert state == "succeeded"

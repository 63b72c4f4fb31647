"""A job and its runs as a reference names them, for the frontends: each function opens the store, reads,
and closes it before returning plain records (no frontend holds a Store of its own)."""

from __future__ import annotations

from pathlib import Path

from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.jobs import LAST_JOB

__all__ = [
    "LAST_JOB",
    "JobRecord",
    "RunRecord",
    "find_job",
    "find_run",
    "job_ids",
    "job_refs",
    "older_namesakes",
    "run_numbers",
    "stored_run",
]


def find_job(home: Path, ref: str | int) -> JobRecord:
    """The job `ref` names (an id, a name: its newest job, or @last); StoreError when none."""
    with Store(home) as store:
        return store.job(ref)


def find_run(home: Path, ref: str | int, run_n: int | None = None) -> tuple[JobRecord, RunRecord]:
    """The job `ref` names and its run `run_n` (None: its latest), as stored now."""
    with Store(home) as store:
        job = store.job(ref)
        return job, store.run(job.id, run_n)


def stored_run(home: Path, job_id: int, run_n: int | None = None) -> RunRecord:
    """Run `run_n` of job `job_id` (None: its latest) as stored now."""
    with Store(home) as store:
        return store.run(job_id, run_n)


def job_ids(home: Path, refs: list[str]) -> list[int]:
    """Each reference resolved now (a name or @last means the job it names now)."""
    with Store(home) as store:
        return [store.job(ref).id for ref in refs]


def run_numbers(home: Path, ref: str) -> list[int]:
    """The numbers of the runs of the job `ref` names, oldest first."""
    with Store(home) as store:
        return [run.n for run in store.runs(store.job(ref).id)]


def job_refs(home: Path) -> list[tuple[int, str]]:
    """The newest jobs' ids and names, as a shell completion offers them."""
    with Store(home) as store:
        return store.job_refs()


def older_namesakes(home: Path, ref: str) -> tuple[JobRecord, list[int]]:
    """The job a name means (its newest job) and the ids of the older jobs of that name not over yet."""
    with Store(home) as store:
        job = store.job(ref)
        return job, [i for i in store.unfinished_namesakes(job.name, job.id) if i < job.id]

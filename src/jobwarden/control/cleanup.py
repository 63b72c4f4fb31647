"""`jobwarden rm --ended [--failed] [--older-than DUR]`: forget many ended jobs at once, with their logs.

Only jobs whose latest run has ended (succeeded, failed, stopped) are candidates: a lost job may still run,
and a job with processes kept past its end (`--keep-running`) still has them; both are left, and said.
The caller confirms the count first (`--yes` for scripts)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

from jobwarden.model import ENDED_STATES, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import JobSummary, RunRecord, Store


class Candidates(NamedTuple):
    jobs: list[tuple[JobSummary, RunRecord]]
    bytes_on_disk: int
    keeping: list[int]  # ended jobs left alone: processes they kept (--keep-running) still run

    @property
    def failed(self) -> int:
        return sum(run.state == JobState.FAILED for _, run in self.jobs)


def ended_jobs(
    home: Path, procfs: ProcFS, *, failed_only: bool, older_than_s: float | None, now: float
) -> Candidates:
    """The jobs `rm --ended` would remove, oldest first, and what their directories hold on disk."""
    with Store(home) as store:
        return _ended_jobs(store, procfs, failed_only, older_than_s, now)


def _ended_jobs(
    store: Store, procfs: ProcFS, failed_only: bool, older_than_s: float | None, now: float
) -> Candidates:
    chosen, keeping = [], []
    for job, run in store.job_list():
        if run.state not in ENDED_STATES or (failed_only and run.state != JobState.FAILED):
            continue
        if older_than_s is not None and (run.ended_at is None or now - run.ended_at < older_than_s):
            continue
        if any(procfs.identity_matches(int(k["pid"]), int(k["start_time"])) for k in run.kept):
            keeping.append(job.id)
            continue
        chosen.append((job, run))
    size = sum(_disk_usage(store.layout.job_dir(job.id)) for job, _ in chosen)
    return Candidates(chosen, size, keeping)


def remove_jobs(home: Path, job_ids: list[int]) -> None:
    """Forget them (one transaction) and delete their directories."""
    with Store(home) as store:
        store.delete_jobs(job_ids)
        for job_id in job_ids:
            shutil.rmtree(store.layout.job_dir(job_id), ignore_errors=True)


def _disk_usage(path: Path) -> int:
    """Bytes the directory's files hold on disk (blocks, not lengths: a trimmed log is sparse)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total

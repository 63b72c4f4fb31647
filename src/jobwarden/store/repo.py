"""The store's interface: every read and write of jobs, runs, processes and events goes through `Store`.

Kept narrow on purpose, so a server database can stand behind it later. `Store` holds no SQL: it owns one
`Database` (store/db.py: the connection, its files, its errors) and each method hands it to the module of
its noun, where the body is (jobs and runs, events and findings, processes, samples, progress,
fingerprints, GPU claims, queues, and the reads of many jobs at once in listing). One line each, so that a
reader looking for what `store.update_run` does opens store/jobs.py, and the callers stay as they were.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden import trace
from jobwarden.model import Finding, JobSpec, JobState, ProcessEnd, ProcessSnapshot
from jobwarden.paths import Layout, ensure_private_dir
from jobwarden.store import events, fingerprints, gpuclaims, jobs, processes, samples
from jobwarden.store import progress as progress_rows  # `progress` names a run's progress in set_progress
from jobwarden.store.db import Database
from jobwarden.store.records import Event, JobRecord, JobSummary, ProcessRecord, RunRecord, StackDump
from jobwarden.store.rollup import Bucket, Reading

if TYPE_CHECKING:  # diagnosis types: not on the `run` path
    from jobwarden.observations import Fingerprint, ProcessStack
    from jobwarden.progress.model import Progress
    from jobwarden.store.queues import QueueInfo, QueuePlace


class Store:
    def __init__(self, home: Path) -> None:
        self.layout = Layout(ensure_private_dir(home))
        if self.layout.database_place.moved:  # the home is on a network file system: WAL needs local disk
            ensure_private_dir(self.layout.database.parent.parent)
            ensure_private_dir(self.layout.database.parent)
        trace.debug(f"store: {self.layout.database}")
        self._db = Database(self.layout)

    # --- the connection (store/db.py) -------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reopen_if_wal_replaced(self) -> bool:
        return self._db.reopen_if_wal_replaced()

    @property
    def store_id(self) -> str:
        return self._db.store_id

    def waiting_at_most(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        return self._db.waiting_at_most(seconds)

    # --- jobs and runs (store/jobs.py) ------------------------------------------------------------

    def create_job(
        self,
        spec: JobSpec,
        options: dict[str, Any],
        now: float,
        state: JobState = JobState.STARTING,
        rerun_of: int | None = None,
    ) -> tuple[int, int]:
        return jobs.create_job(self._db, spec, options, now, state, rerun_of)

    def make_run_dir(self, job_id: int, run: int) -> Path:
        return jobs.make_run_dir(self._db, job_id, run)

    def job(self, ref: str | int) -> JobRecord:
        return jobs.job(self._db, ref)

    def unfinished_namesakes(self, name: str, job_id: int) -> list[int]:
        return jobs.unfinished_namesakes(self._db, name, job_id)

    def job_refs(self, limit: int = 500) -> list[tuple[int, str]]:
        return jobs.job_refs(self._db, limit)

    def jobs(self) -> list[JobRecord]:
        return jobs.jobs(self._db)

    def delete_job(self, job_id: int) -> None:
        jobs.delete_jobs(self._db, [job_id])

    def delete_jobs(self, job_ids: Sequence[int]) -> None:
        jobs.delete_jobs(self._db, job_ids)

    def run(self, job_id: int, n: int | None = None) -> RunRecord:
        return jobs.run(self._db, job_id, n)

    def runs(self, job_id: int) -> list[RunRecord]:
        return jobs.runs(self._db, job_id)

    def new_run(self, job_id: int, state: JobState, now: float) -> int:
        return jobs.new_run(self._db, job_id, state, now)

    def new_run_after(self, job_id: int, after: int, state: JobState, now: float) -> int | None:
        return jobs.new_run_after(self._db, job_id, after, state, now)

    def latest_runs(self) -> dict[int, RunRecord]:
        return jobs.latest_runs(self._db)

    def update_run(
        self, job_id: int, n: int, *, only_if_state: Iterable[JobState] | None = None, **fields: Any
    ) -> bool:
        return jobs.update_run(self._db, job_id, n, only_if_state=only_if_state, **fields)

    def update_run_with_event(
        self,
        job_id: int,
        n: int,
        kind: str,
        at: float,
        data: dict[str, Any],
        *,
        only_if_state: Iterable[JobState] | None = None,
        **fields: Any,
    ) -> bool:
        return jobs.update_run_with_event(
            self._db, job_id, n, kind, at, data, only_if_state=only_if_state, **fields
        )

    # --- events, findings, stack dumps (store/events.py) ------------------------------------------

    def add_event(self, job_id: int, run: int | None, kind: str, at: float, **data: Any) -> None:
        events.add_event(self._db, job_id, run, kind, at, **data)

    def events(self, job_id: int, run: int | None = None) -> list[Event]:
        return events.events(self._db, job_id, run)

    def add_finding(self, job_id: int, run: int, at: float, finding: Finding) -> None:
        events.add_finding(self._db, job_id, run, at, finding)

    def resolve_finding(self, job_id: int, run: int, finding: Finding, at: float) -> None:
        events.resolve_finding(self._db, job_id, run, finding, at)

    def update_finding(self, job_id: int, run: int, finding: Finding, latest: Finding) -> None:
        events.update_finding(self._db, job_id, run, finding, latest)

    def findings(self, job_id: int, run: int) -> list[tuple[float, Finding]]:
        return events.findings(self._db, job_id, run)

    def add_stacks(
        self, job_id: int, run: int, at: float, trigger: str, stacks: Sequence[ProcessStack]
    ) -> int:
        return events.add_stacks(self._db, job_id, run, at, trigger, stacks)

    def stacks(self, job_id: int, run: int) -> list[StackDump]:
        return events.stacks(self._db, job_id, run)

    # --- processes (store/processes.py) and samples (store/samples.py) ----------------------------

    def record_tree(
        self,
        job_id: int,
        run: int,
        now: float,
        live: Sequence[ProcessSnapshot],
        ended: Sequence[ProcessEnd],
        sample: Reading | None = None,
        rollups: Sequence[Bucket] = (),
    ) -> None:
        processes.record_tree(self._db, job_id, run, now, live, ended, sample, rollups)

    def processes(self, job_id: int, run: int, live_only: bool = False) -> list[ProcessRecord]:
        return processes.processes(self._db, job_id, run, live_only)

    def add_samples(
        self,
        job_id: int,
        run: int,
        readings: Sequence[Reading] = (),
        rollups: Sequence[Bucket] = (),
        prune_at: float | None = None,
    ) -> None:
        samples.add_samples(self._db, job_id, run, readings, rollups, prune_at)

    def readings(
        self, job_id: int, run: int, since: float = -math.inf, until: float = math.inf
    ) -> list[Reading]:
        return samples.readings(self._db, job_id, run, since, until)

    def rollups(
        self, job_id: int, run: int, tier: int, since: float = -math.inf, until: float = math.inf
    ) -> list[Bucket]:
        return samples.rollups(self._db, job_id, run, tier, since, until)

    def latest_sample(self, job_id: int, run: int) -> sqlite3.Row | None:
        return samples.latest_sample(self._db, job_id, run)

    @property
    def malformed_samples(self) -> int:
        """The sample rows the readers skipped since this Store was opened (store/samples.py)."""
        return len(self._db.malformed)

    # --- progress (store/progress.py) and fingerprints (store/fingerprints.py) --------------------

    def set_progress(self, job_id: int, run: int, progress: Progress) -> None:
        progress_rows.set_progress(self._db, job_id, run, progress)

    def progress(self, job_id: int, run: int) -> Progress | None:
        return progress_rows.progress(self._db, job_id, run)

    def progress_of_runs(
        self, runs: Iterable[tuple[int, int]], metrics: bool = False
    ) -> dict[tuple[int, int], Progress]:
        return progress_rows.progress_of_runs(self._db, runs, metrics)

    def set_fingerprint(self, job_id: int, run: int, at: float, fingerprint: Fingerprint) -> None:
        fingerprints.set_fingerprint(self._db, job_id, run, at, fingerprint)

    def fingerprint(self, job_id: int, run: int) -> Fingerprint | None:
        return fingerprints.fingerprint(self._db, job_id, run)

    def last_success(
        self, command: Sequence[str], cwd: str, before: float, besides: tuple[int, int]
    ) -> tuple[int, int] | None:
        return fingerprints.last_success(self._db, command, cwd, before, besides)

    # --- many jobs at once (store/listing.py: loaded by the lists, never by `run` nor a shim) -----

    def job_list(
        self,
        *,
        unfinished_only: bool = False,
        ended_since: float | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[tuple[JobSummary, RunRecord]]:
        from jobwarden.store import listing

        return listing.job_list(
            self._db, unfinished_only=unfinished_only, ended_since=ended_since, limit=limit, offset=offset
        )

    def current_findings(
        self, runs: Iterable[tuple[int, int]]
    ) -> dict[tuple[int, int], list[tuple[str, str]]]:
        from jobwarden.store import listing

        return listing.current_findings(self._db, runs)

    def finding_counts(self) -> dict[str, int]:
        from jobwarden.store import listing

        return listing.finding_counts(self._db)

    def run_state_counts(self, states: Iterable[JobState]) -> dict[JobState, int]:
        from jobwarden.store import listing

        return listing.run_state_counts(self._db, states)

    def peak_rss(self, job_id: int, run: int) -> int | None:
        from jobwarden.store import listing

        return listing.peak_rss(self._db, job_id, run)

    # --- queues (store/queues.py: loaded by those who use them) -----------------------------------

    def take_queue_place(self, queue: str, job_id: int, run: int, now: float) -> QueuePlace:
        from jobwarden.store import queues

        return self._db.translated(lambda: queues.take_queue_place(self._db.conn, queue, job_id, run, now))

    def set_queue_parallel(self, queue: str, parallel: int) -> None:
        from jobwarden.store import queues

        self._db.translated(lambda: queues.set_queue_parallel(self._db.conn, queue, parallel))

    def queues(self) -> list[QueueInfo]:
        from jobwarden.store import queues

        return self._db.translated(lambda: queues.queues(self._db.conn))

    # --- GPU claims (store/gpuclaims.py) ----------------------------------------------------------

    def claim_gpus(self, job_id: int, run: int, free: Sequence[int], count: int, now: float) -> list[int]:
        return gpuclaims.claim_gpus(self._db, job_id, run, free, count, now)

    def release_gpus(self, job_id: int, run: int) -> None:
        gpuclaims.release_gpus(self._db, job_id, run)

    def gpu_claims(self) -> dict[int, tuple[int, int]]:
        return gpuclaims.gpu_claims(self._db)

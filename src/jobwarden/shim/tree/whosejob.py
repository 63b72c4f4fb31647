"""Which of this user's other jobs a process outside the job belongs to: the holder of a lock the job
waits for, the writer of its pipe, the peer of its socket (probes.waits' parties).

A process is a job's when that job's live run recorded it (its pid and start time, as its shim saw it), or
when it carries the job's JOBWARDEN_JOB_ID marker of this home and store, runs as this user, and
descends from a process that run recorded: a marker is only an environment variable, anyone may copy it
(the rule `orphans` and the job's own tree follow). Another user's environment is not read: such a process
is named by the store's records or not at all.

Only asked when a hung run's wait leads outside it; the store is read once then (its jobs, their latest
runs, the live processes of the live ones).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from jobwarden.errors import AccessDenied, JobNotFound, ProcessGone, StoreError
from jobwarden.observations import WaitParty
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.markers import read_job_marks
from jobwarden.store import Store

MAX_ANCESTORS = 64  # parent links followed to find the recorded process a marked one descends from


def with_jobs(
    parties: Mapping[int, WaitParty], store: Store, procfs: ProcFS, this_job: int
) -> dict[int, WaitParty]:
    """The parties, each outside process that is one of this user's other jobs' named with that job."""
    outside = [p for p in parties.values() if not p.in_job]
    if not outside:
        return dict(parties)
    try:
        finder = _Finder(store, procfs, this_job)
    except StoreError:
        return dict(parties)
    found = dict(parties)
    for party in outside:
        job = finder.job_of(party.pid)
        if job is not None:
            found[party.pid] = WaitParty(party.pid, party.cmdline, party.user, False, job[0], job[1])
    return found


class _Finder:
    def __init__(self, store: Store, procfs: ProcFS, this_job: int) -> None:
        self.procfs, self.store = procfs, store
        self.home = {str(store.layout.home), os.path.realpath(store.layout.home)}
        self.names: dict[int, str] = {}
        self.recorded: dict[tuple[int, int], int] = {}  # (pid, start time) -> the live run's job
        for job in store.jobs():
            if job.id == this_job:
                continue
            self.names[job.id] = job.name
            with contextlib.suppress(JobNotFound):
                run = store.run(job.id)
                if run.ended_at is None:
                    self._record(job.id, run.n, run.pid, run.pid_start)

    def _record(self, job: int, run: int, pid: int | None, start: int | None) -> None:
        idents = [(p.pid, p.start_time) for p in self.store.processes(job, run, live_only=True)]
        if pid and start:
            idents.append((pid, start))
        for ident in idents:
            self.recorded[ident] = job

    def job_of(self, pid: int) -> tuple[int, str] | None:
        try:
            st = self.procfs.stat(pid)
        except (ProcessGone, AccessDenied):
            return None
        job = self.recorded.get((pid, st.start_time)) or self._marked(pid, st.ppid)
        return (job, self.names[job]) if job is not None and job in self.names else None

    def _marked(self, pid: int, ppid: int) -> int | None:
        """The job its marker names, when the marker is this store's, the process is this user's, and it
        descends from a process that job's live run recorded."""
        try:
            if self.procfs.uid(pid) != os.geteuid():
                return None
            marks = read_job_marks(self.procfs, pid)
        except (ProcessGone, AccessDenied):
            return None
        if marks is None or (marks.home not in self.home and os.path.realpath(marks.home) not in self.home):
            return None
        if marks.store is not None and marks.store != self.store.store_id:
            return None
        for _ in range(MAX_ANCESTORS):
            if ppid <= 1:
                return None
            try:
                parent = self.procfs.stat(ppid)
            except (ProcessGone, AccessDenied):
                return None
            if self.recorded.get((parent.pid, parent.start_time)) == marks.job_id:
                return marks.job_id
            ppid = parent.ppid
        return None

"""Find a job's processes by the JOBWARDEN_* variables it was started with: the fallback that works when
its shim is gone and nothing else links the processes to the job."""

from __future__ import annotations

import os
from typing import NamedTuple

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.osapi.procfs import ProcFS, ProcStat
from jobwarden.paths import HOME_ENV, JOB_ID_ENV, RUN_ENV, STORE_ENV


def job_markers(home: str, job_id: int, run: int | None = None) -> dict[str, str]:
    markers = {HOME_ENV: home, JOB_ID_ENV: str(job_id)}
    if run is not None:
        markers[RUN_ENV] = str(run)
    return markers


def find_marked(
    procfs: ProcFS, markers: dict[str, str], exclude: set[int] | None = None, store: str | None = None
) -> list[ProcStat]:
    """Live (non-zombie) processes carrying every marker. Other users' processes cannot be read: skipped.
    With `store`, a process marked by another database (one emptied or moved aside: same job ids) is not
    one of them; one marked by no database predates the mark, and is."""
    found = []
    for st in procfs.iter_stats():
        if st.state in ("Z", "X") or (exclude and st.pid in exclude):
            continue
        try:
            if procfs.environ_has(st.pid, markers) and _of_store(procfs, st.pid, store):
                found.append(st)
        except (ProcessGone, AccessDenied):
            continue
    return _of_the_job(procfs, found)


MAX_ANCESTORS = 64  # parent links followed to find whether a process descends from the job


def _of_the_job(procfs: ProcFS, marked: list[ProcStat]) -> list[ProcStat]:
    """The marked processes that are the job's. Anyone can set the markers, and root reads every user's
    environment: a process of another uid than the job's (ours: the store is ours alone) counts only if
    it descends from a marked process of ours (a job may change user: `setpriv`, `runuser`)."""
    uid = os.geteuid()
    ours: set[int] = set()
    foreign: list[ProcStat] = []
    for st in marked:
        try:
            owner = procfs.uid(st.pid)
        except ProcessGone:
            continue
        if owner == uid:
            ours.add(st.pid)
        else:
            foreign.append(st)
    kept = {st.pid for st in foreign if _descends_from(procfs, st, ours)}
    return [st for st in marked if st.pid in ours or st.pid in kept]


def _descends_from(procfs: ProcFS, st: ProcStat, ancestors: set[int]) -> bool:
    ppid = st.ppid
    for _ in range(MAX_ANCESTORS):
        if ppid in ancestors:
            return True
        if ppid <= 1:
            return False
        try:
            ppid = procfs.stat(ppid).ppid
        except (ProcessGone, AccessDenied):
            return False
    return False


def _of_store(procfs: ProcFS, pid: int, store: str | None) -> bool:
    if store is None:
        return True
    return procfs.environ_values(pid, (STORE_ENV,)).get(STORE_ENV, store) == store


class JobMarks(NamedTuple):
    """The JOBWARDEN_* variables a process was started with: whose job it is, even after its shim died."""

    home: str
    job_id: int
    run: int | None
    store: str | None = None  # the database that started it (absent before jobwarden marked it)


def read_job_marks(procfs: ProcFS, pid: int) -> JobMarks | None:
    """The job `pid` was started for, or None for an unmarked process. Raises ProcessGone, and
    AccessDenied for another user's process."""
    values = procfs.environ_values(pid, (HOME_ENV, JOB_ID_ENV, RUN_ENV, STORE_ENV))
    job, run = values.get(JOB_ID_ENV, ""), values.get(RUN_ENV, "")
    if not (job.isascii() and job.isdigit()) or HOME_ENV not in values:
        return None
    run_n = int(run) if run.isascii() and run.isdigit() else None
    return JobMarks(values[HOME_ENV], int(job), run_n, values.get(STORE_ENV))

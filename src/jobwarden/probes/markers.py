"""Find a job's processes by the JOBWARDEN_* variables it was started with: the fallback that works when
its shim is gone and nothing else links the processes to the job."""

from __future__ import annotations

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
    return found


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

"""What `top` reads in one pass of the store: the job list, each live job's GPU memory, and the selected
job's whole view with its recent samples. The store is closed before the plain data is returned: no
cursor or transaction outlives a refresh (a reader holding one would starve the WAL's checkpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from jobwarden.control.views.joblist import JobView, job_views
from jobwarden.control.views.jobstatus import JobStatus, job_status
from jobwarden.control.views.metrics import Sample, job_samples
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store

# a job's GPU memory is its latest sample's; the shim records one at least every 10 s, so older than
# this means unknown
GPU_FRESH_S = 30.0


class TopRead(NamedTuple):
    views: list[JobView]
    gpu_memory: list[int | None]  # each view's job's, where known
    selected: JobView | None  # the selected job's view (the first one's when none is selected)
    status: JobStatus | None  # and its whole status
    samples: list[Sample]  # its samples over the last `window_s`, at most `points`


def top_read(
    home: Path,
    procfs: ProcFS,
    include_ended: bool,
    selected: int | None,
    now: float,
    window_s: float,
    points: int,
) -> TopRead:
    with Store(home) as store:
        views = job_views(store, procfs, include_ended=include_ended)
        gpu_memory = [_gpu_memory(store, v, now) for v in views]
        chosen = next((v for v in views if v.job.id == selected), views[0] if views else None)
        if chosen is None:
            return TopRead(views, gpu_memory, None, None, [])
        status = job_status(store, procfs, chosen.job.id)
        samples = job_samples(store, chosen.job.id, status.run.n, since=now - window_s, points=points)
    return TopRead(views, gpu_memory, chosen, status, samples)


def _gpu_memory(store: Store, view: JobView, now: float) -> int | None:
    if view.run.state.is_ended:
        return None
    samples = job_samples(store, view.job.id, view.run.n, since=now - GPU_FRESH_S)
    latest = samples[-1].gpu_memory_bytes if samples else None
    return int(latest) if latest is not None else None

"""Sweeps: a run that waits its turn before it starts, `queued` with the reason in `status`.

- `--after JOB`: until each job it names has succeeded. One that failed or was stopped cancels this run
  (failed, end reason `dependency-failed`, a finding that names it): pueue's DependencyFailed. A job that
  failed but will be restarted (its shim is alive and its restart policy allows it) is still waited for.
- `--queue NAME`: until one of the queue's places is free and it is this run's turn (store.queues).

Both come before the GPU wait (shim.resources.GpuQueue): a run holds no GPU while it waits for its turn.
"""

from __future__ import annotations

from typing import NamedTuple

from jobwarden.clock import Clock
from jobwarden.errors import JobNotFound
from jobwarden.model import JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import JobRecord, RunRecord, Store

TURN_RETRY_S = 1.0  # a waiting run looks at its dependencies and its queue this often
DEPENDENCY_FAILED = "dependency-failed"


class Turn(NamedTuple):
    ready: bool
    waiting: str = ""  # why not yet (for `status`)
    cancelled: str = ""  # why never: a dependency failed


def check_turn(store: Store, job: JobRecord, run: int, procfs: ProcFS, clock: Clock) -> Turn:
    """One look: the dependencies first, then the queue."""
    for dep in job.options.after:
        turn = _dependency(store, dep, procfs)
        if not turn.ready:
            return turn
    queue = job.options.queue
    if queue is not None:
        place = store.take_queue_place(queue, job.id, run, clock.wall())
        if not place.taken:
            return Turn(False, waiting=place.describe())
    return Turn(True)


def _dependency(store: Store, dep_id: int, procfs: ProcFS) -> Turn:
    try:
        dep = store.job(dep_id)
        latest = store.run(dep.id)
    except JobNotFound:
        return Turn(False, cancelled=f"job {dep_id}, which it was to run after (--after), was removed")
    who = f"job {dep.id} ({dep.name})"
    if latest.state == JobState.SUCCEEDED:
        return Turn(True)
    if latest.state.is_ended and not _may_restart(dep, latest, procfs):
        return Turn(False, cancelled=f"{who} {_how(latest)}, and this job was to run after it succeeded")
    return Turn(False, waiting=f"waiting for {who} to succeed (--after): it is {latest.state}")


def _may_restart(job: JobRecord, run: RunRecord, procfs: ProcFS) -> bool:
    """A failed run whose shim lives on and may start another attempt (between the end record and the
    next run there are a few milliseconds): not final yet."""
    if run.state != JobState.FAILED or (job.options.restart == "no" and job.options.on_hang != "restart"):
        return False
    return bool(run.shim_pid and run.shim_start and procfs.identity_matches(run.shim_pid, run.shim_start))


def _how(run: RunRecord) -> str:
    if run.signal:
        return f"was killed by {run.signal}"
    if run.state == JobState.STOPPED:
        return "was stopped"
    if run.exit_code is not None:
        return f"failed (exit code {run.exit_code})"
    return f"ended {run.state}"

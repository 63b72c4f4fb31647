"""Sweeps: a run that waits its turn before it starts, `queued` with the reason in `status`.

- `--after JOB`: until each job it names has succeeded. One that failed or was stopped cancels this run
  (failed, end reason `dependency-failed`, a finding that names it): pueue's DependencyFailed. A job that
  failed but will be restarted (its shim is alive and its restart policy allows it) is still waited for.
  A job whose supervisor died (`lost`, recorded or not yet) is waited for while a process of it still
  runs: it may still succeed, and `jobwarden adopt` records its end. Once none runs, nothing can record
  a success any more: it counts as failed, rather than this run waiting for ever.
- `--queue NAME`: until one of the queue's places is free and it is this run's turn (store.queues).

Both come before the GPU wait (shim.admission.resources.GpuQueue): a run holds no GPU while it waits for its
turn.
"""

from __future__ import annotations

from typing import NamedTuple

from jobwarden.clock import Clock
from jobwarden.errors import JobNotFound
from jobwarden.model import JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.markers import find_marked, job_markers
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.records import restart_never_made

TURN_RETRY_S = 1.0  # a waiting run looks at its dependencies and its queue this often
DEPENDENCY_FAILED = "dependency-failed"


class Turn(NamedTuple):
    ready: bool
    waiting: str = ""  # why not yet (for `status`)
    cancelled: str = ""  # why never: a dependency failed
    remedy: str = ""  # what to do then, when not the usual (see why, rerun once it succeeds)


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
    waiting = f"waiting for {who} to succeed (--after): it is {latest.state}"
    if not _supervisor_died(latest, procfs):
        return Turn(False, waiting=waiting)
    if not _still_runs(store, dep, latest, procfs):
        return _lost_for_good(store, dep, latest, who)
    waiting = f"waiting for {who} to succeed (--after): it is lost (its supervisor died)"
    return Turn(
        False, waiting=f"{waiting}; its processes still run: `jobwarden adopt {dep.id}` records its end"
    )


def _lost_for_good(store: Store, dep: JobRecord, run: RunRecord, who: str) -> Turn:
    """A dependency whose supervisor died and of which nothing runs: no success can come of it now."""
    kinds = [e.kind for e in store.events(dep.id, run.n)]
    if restart_never_made(run._replace(state=JobState.LOST), kinds):
        why = (
            "was lost between runs: its supervisor died in a restart's backoff, so the restart was never made"
        )
        remedy = f"`jobwarden adopt {dep.id}` makes that restart; then run this one again (`jobwarden rerun`)"
    else:
        why = "was lost: its supervisor died and none of its processes runs, so its end was never recorded"
        remedy = (
            f"`jobwarden rerun {dep.id}` runs job {dep.id} again as a new job; then run this one again with "
            "--after that new job"
        )
    return Turn(False, cancelled=f"{who} {why}, and this job was to run after it succeeded", remedy=remedy)


def _supervisor_died(run: RunRecord, procfs: ProcFS) -> bool:
    """`lost`, or a run that should have a shim and whose shim is gone (nobody has looked at it since, so
    it is not recorded lost yet). A shim not recorded yet is still starting: not dead."""
    if run.state == JobState.LOST:
        return True
    if not run.state.is_active or not (run.shim_pid and run.shim_start):
        return False
    return not procfs.identity_matches(run.shim_pid, run.shim_start)


def _still_runs(store: Store, job: JobRecord, run: RunRecord, procfs: ProcFS) -> bool:
    """A process of a run whose supervisor died: its main process (one identity check) or, once that has
    ended, any process carrying the run's markers (a scan of /proc, made only then)."""
    if run.pid and run.pid_start and procfs.identity_matches(run.pid, run.pid_start):
        return True
    markers = job_markers(str(store.layout.home), job.id, run.n)
    return bool(find_marked(procfs, markers, store=store.store_id))


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

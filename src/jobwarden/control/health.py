"""Is the job alive and well? One judgement for `jobwarden health` (an exec liveness probe) and the web
server's `GET /healthz` (a probe that cannot exec), so that both always answer alike (DESIGN "In a
container").

ok: the run is on its way (queued, starting, running, restarting, stopping) and not hung, or it succeeded.
hung: the shim judged it hung (a `hung` event: its hang window passed with no sign of progress) and no sign
of progress came since: no output, no heartbeat, no sample of the tree above the watchdog's CPU floor.
failed: it ended otherwise (failed, stopped, lost). no-job: no such job, or no job at all in this home.

A kubelet restarts the container when its liveness probe fails: that is what a person did by hand in the
founding incident, for a job run with `--on-hang dump` (with `--on-hang stop` the container ends itself).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, NamedTuple

from jobwarden.clock import iso, shown_time
from jobwarden.control.views.joblist import refresh
from jobwarden.errors import JobNotFound, StoreError
from jobwarden.model import JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import Layout
from jobwarden.store import RunRecord, Store
from jobwarden.verdict.signs import CPU_FLOOR_PERCENT

OK, HUNG, FAILED, NO_JOB = "ok", "hung", "failed", "no-job"
EXIT_CODES = {OK: 0, HUNG: 1, FAILED: 1, NO_JOB: 2}
_ON_ITS_WAY = (
    JobState.QUEUED,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.RESTARTING,
    JobState.STOPPING,
)


class Health(NamedTuple):
    status: str  # ok | hung | failed | no-job
    reason: str  # one line: why
    job_id: int | None = None
    run: int | None = None
    state: str | None = None
    hung_at: float | None = None  # when the hang was judged, if it is hung

    @property
    def exit_code(self) -> int:
        """`jobwarden health`'s exit status: 0 ok, 1 hung or failed, 2 no such job."""
        return EXIT_CODES[self.status]

    @property
    def http(self) -> tuple[int, str]:
        """What `GET /healthz` answers: 200 `ok`, or 503 `hung` / `failed` (no job at all is `failed`: a
        probe must not call a pod healthy whose job never started)."""
        if self.status == OK:
            return 200, OK
        return 503, HUNG if self.status == HUNG else FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "healthy": self.status == OK,
            "reason": self.reason,
            "id": self.job_id,
            "run": self.run,
            "state": self.state,
            "hung_at": iso(self.hung_at),
        }


class Progress(NamedTuple):
    """The signs of progress the store and the run's files keep, as wall times."""

    output_at: float | None  # output.log last written
    heartbeat_at: float | None  # the heartbeat file last touched
    busy_at: float | None  # the latest sample of the tree above the watchdog's CPU floor


def judge(run: RunRecord, hung_at: float | None, progress: Progress) -> Health:
    """The judgement itself, from the (refreshed) run, when a hang was judged, and the signs of progress."""
    which = (run.job_id, run.n, str(run.state))
    if run.state == JobState.SUCCEEDED:
        return Health(OK, "succeeded", *which)
    if run.state not in _ON_ITS_WAY:
        how = f"exit code {run.exit_code}" if run.exit_code is not None else run.signal or run.end_reason
        return Health(FAILED, f"{run.state}" + (f" ({how})" if how else ""), *which)
    if hung_at is not None and not any(at is not None and at > hung_at for at in progress):
        return Health(HUNG, f"hung since {shown_time(hung_at)}; {_last_sign(progress)}", *which, hung_at)
    return Health(OK, f"{run.state}", *which)


def _last_sign(progress: Progress) -> str:
    """The last sign of life before the hang, which is what a person asks for: the moment the watchdog
    called it hung is a window later."""
    signs = {"output": progress.output_at, "heartbeat": progress.heartbeat_at, "CPU work": progress.busy_at}
    known = {what: at for what, at in signs.items() if at is not None}
    if not known:
        return "no sign of progress seen since it started"
    what, at = max(known.items(), key=lambda item: item[1])
    return f"last sign of progress: its {what} at {shown_time(at)}"


def health(home: Path, job_ref: str | None = None, procfs: ProcFS | None = None) -> Health:
    """What `jobwarden health [JOB]` and `GET /healthz` answer, for the home `home`. Never creates the
    home nor the store (a probe on a fresh container finds no job); a store it cannot read is `failed`,
    never `ok`."""
    if not Layout(home).database.exists():
        return Health(NO_JOB, f"no job in {home} yet")
    try:
        with Store(home) as store:
            return job_health(store, procfs or ProcFS(), job_ref)
    except StoreError as err:
        return Health(FAILED, f"cannot read the store: {err.message}")


def job_health(store: Store, procfs: ProcFS, job_ref: str | None = None) -> Health:
    """The health of job `job_ref` (id or name), or of the newest job in this home when None."""
    if job_ref is None:
        newest = store.job_refs(limit=1)
        if not newest:
            return Health(NO_JOB, "no job in this home yet")
        job_ref = str(newest[0][0])
    try:
        job = store.job(job_ref)
        run = refresh(store, procfs, job, store.run(job.id))
    except JobNotFound as err:
        return Health(NO_JOB, err.message)
    hung = [e.at for e in store.events(job.id, run.n) if e.kind == "hung"]
    hung_at = max(hung) if hung else None
    return judge(run, hung_at, _progress(store, run, hung_at))


def _progress(store: Store, run: RunRecord, since: float | None) -> Progress:
    if since is None:
        return Progress(None, None, None)
    layout = store.layout
    busy = [
        r.at
        for r in store.readings(run.job_id, run.n, since=since)
        if r.cpu_percent is not None and r.cpu_percent >= CPU_FLOOR_PERCENT
    ]
    return Progress(
        _mtime(layout.output_log(run.job_id, run.n)),
        _mtime(layout.heartbeat_file(run.job_id, run.n)),
        max(busy) if busy else None,
    )


def _mtime(path: os.PathLike[str]) -> float | None:
    with contextlib.suppress(OSError):
        return os.stat(path).st_mtime
    return None

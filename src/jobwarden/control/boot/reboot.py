"""A machine that reboots (a kernel update) kills every job. Each run stores the boot id its shim ran under
(/proc/sys/kernel/random/boot_id, new at every boot); a run not over whose boot id is not this boot's was
ended by the reboot, whatever its pids say now (they count from 1 again and may name anything).

Any look at such a run (`ps`, `status`, `wait`...) records it: failed, end reason `reboot`, finding
`machine-rebooted`. `jobwarden resume` (run at boot by `jobwarden boot enable`) does that for every run,
then starts again, as a new attempt of the same job, those whose restart policy asks for it: pm2's
resurrect, and OpenPAI's "retried after a system upgrade". A run that `jobwarden stop` was ending when the
machine went down is recorded stopped, and stays so: the reboot finished what the user asked.

Several `resume` may run at once (the boot unit, cron, a user): the new run is taken by a compare-and-set
in the store (Store.new_run_after), so exactly one of them starts it and the others say so.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from jobwarden.clock import SystemClock, shown_time
from jobwarden.control.shimproc import fork_shim
from jobwarden.errors import StoreError
from jobwarden.model import UNFINISHED_STATES, EndReason, Finding, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import JobRecord, JobSummary, RunRecord, Store

RULE = "machine-rebooted"


@lru_cache(maxsize=4)
def _boot_id(root: Path) -> str | None:
    return ProcFS(root).boot_id()


def current_boot_id(procfs: ProcFS) -> str | None:
    """This boot's id, read once a process (`ps` looks at every live run)."""
    return _boot_id(procfs.root)


def ended_by_reboot(procfs: ProcFS, run: RunRecord) -> bool:
    """A run not over, supervised under another boot: the reboot ended it."""
    if run.state not in UNFINISHED_STATES or not run.boot_id:
        return False
    now = current_boot_id(procfs)
    return now is not None and now != run.boot_id


def mark_rebooted(store: Store, procfs: ProcFS, job: JobRecord | JobSummary, run: RunRecord) -> RunRecord:
    """running | lost | queued... -> failed (reboot): recorded once, with its finding. The end is the
    moment this boot began: every process of the run died before it. A run the user was stopping
    (`jobwarden stop` asked, its grace running) -> stopped: what the user asked for, never started again."""
    now = SystemClock().wall()
    try:
        ended = procfs.boot_time()
    except OSError:
        ended = now
    boot = current_boot_id(procfs)
    stopping = run.stop_requested_at is not None
    state = JobState.STOPPED if stopping else JobState.FAILED
    error = "the machine rebooted while it ran: every process of it died at the shutdown"
    try:
        if store.update_run_with_event(
            job.id,
            run.n,
            "rebooted",
            ended,
            {"boot_id_then": run.boot_id, "boot_id_now": boot, "state_then": str(run.state)},
            only_if_state=UNFINISHED_STATES,
            state=state,
            end_reason=EndReason.REBOOT,
            ended_at=ended,
            error=error,
            queued_reason=None,
        ):
            restarts = store.job(job.id).options.restart != "no"  # once a run: a list holds summaries
            store.add_finding(job.id, run.n, now, reboot_finding(job.id, run, boot, ended, restarts))
    except StoreError:  # a full disk: still show the truth, record it next time
        return run._replace(state=state, end_reason=EndReason.REBOOT, ended_at=ended, error=error)
    return store.run(job.id, run.n)


def reboot_finding(
    job_id: int, run: RunRecord, boot_now: str | None, booted_at: float, restarts: bool = False
) -> Finding:
    evidence = (
        f"the run's supervisor ran under boot id {run.boot_id}",
        f"this boot ({boot_now or 'boot id unknown'}) began at {shown_time(booted_at)}",
    )
    if run.stop_requested_at is not None:
        return Finding(
            rule=RULE,
            title="ended by a reboot of the machine while it was being stopped",
            summary="the machine rebooted while `jobwarden stop` ended it: every process of it died at the "
            "shutdown, and it stays stopped",
            severity="info",
            evidence=(*evidence, f"`jobwarden stop` was asked at {shown_time(run.stop_requested_at)}"),
            remedy=f"nothing to do; `jobwarden rerun {job_id}` starts it again as a new job",
        )
    was = {JobState.QUEUED: "waiting to start", JobState.LOST: "running unsupervised"}.get(
        run.state, "running"
    )
    return Finding(
        rule=RULE,
        title="ended by a reboot of the machine",
        summary=f"the machine rebooted while the job was {was}: every process of it died at the shutdown",
        severity="error",
        evidence=evidence,
        remedy=(
            "`jobwarden resume` starts it again as its next run (it has --restart), with every such job; "
            "`jobwarden boot enable` has that done at each boot"
            if restarts
            else f"`jobwarden rerun {job_id}` starts it again now; for jobs to come back by themselves, run "
            "them with --restart on-failure (or always) and `jobwarden boot enable` once"
        ),
    )


class ReadyShim(Protocol):
    """A shim forked before its run is recorded (control.shimproc.ForkedShim): `start` hands it the run
    and returns its first word; leaving its `with` without `start` makes it exit unseen."""

    def start(self, job_id: int, run: int) -> dict[str, Any]: ...


# forks the shim of a run about to be recorded; the unit tests give one that supervises on a fake OS
StartShim = Callable[[Path, str], AbstractContextManager[ReadyShim]]


class Resumed(NamedTuple):
    """What `resume` did for one job the reboot ended."""

    job_id: int
    name: str
    ended_run: int
    new_run: int | None  # None: not started again
    pid: int | None
    why: str  # started again, or why not

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.job_id,
            "name": self.name,
            "ended_run": self.ended_run,
            "run": self.new_run,
            "pid": self.pid,
            "started": self.new_run is not None,
            "why": self.why,
        }


def resume(home: Path, procfs: ProcFS, start_shim: StartShim = fork_shim) -> list[Resumed]:
    """Mark every run the reboot ended, then start again (a new attempt each) the jobs whose restart
    policy asks for it. Idempotent: a job started again has a new latest run, never looked at twice."""
    with Store(home) as store:
        for job, run in store.job_list(unfinished_only=True):
            if ended_by_reboot(procfs, run):
                mark_rebooted(store, procfs, job, run)
        ended = [
            (store.job(job.id), run)
            for job, run in store.job_list()
            if run.end_reason == EndReason.REBOOT and not _resumed_before(store, job.id, run.n)
        ]
    done = []
    for record, run in ended:
        why = _not_again(record, run)
        if why:
            done.append(Resumed(record.id, record.name, run.n, None, None, why))
            _note(home, record.id, run.n, why)
            continue
        done.append(_start_again(home, record, run, start_shim))
    return done


def _not_again(job: JobRecord, run: RunRecord) -> str | None:
    """Why a run the reboot ended is not started again; None: it is."""
    if run.state == JobState.STOPPED:
        return "not started again: it was being stopped (jobwarden stop) when the machine rebooted"
    if job.options.restart == "no":
        return "not started again: it has no --restart (jobwarden rerun starts it by hand)"
    return None


def _resumed_before(store: Store, job_id: int, n: int) -> bool:
    return any(e.kind == "resume-declined" for e in store.events(job_id, n))


def _note(home: Path, job_id: int, n: int, why: str) -> None:
    with Store(home) as store:
        store.add_event(job_id, n, "resume-declined", SystemClock().wall(), reason=why)


def _start_again(home: Path, job: JobRecord, ended: RunRecord, start_shim: StartShim) -> Resumed:
    """A new run of the job, handed to a new shim: the restart the reboot cut short."""
    options = job.options
    state = JobState.QUEUED if options.wants_gpus or options.after or options.queue else JobState.STARTING
    with start_shim(home, "launch") as shim, Store(home) as store:
        now = SystemClock().wall()
        # the compare-and-set: only while the ended run is still the latest (another `resume` may have
        # started it since we looked); leaving without `start` makes the forked shim exit unseen
        n = store.new_run_after(job.id, ended.n, state, now)
        if n is None:
            taken = store.run(job.id).n
            why = f"started again by another jobwarden resume, as run {taken}"
            return Resumed(job.id, job.name, ended.n, None, None, why)
        store.add_event(job.id, n, "resumed", now, after_run=ended.n, reason="the machine rebooted")
        report = shim.start(job.id, n)
    if "error" in report:
        return Resumed(job.id, job.name, ended.n, n, None, f"could not start again: {report['error']}")
    why = f"started again as run {n} (--restart {options.restart})"
    return Resumed(job.id, job.name, ended.n, n, report.get("pid"), why)

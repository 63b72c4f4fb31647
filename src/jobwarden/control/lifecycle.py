"""`stop`, `adopt`, `wait`, `rm`: acting on a job through its shim, never on a bare pid."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from jobwarden import config, trace
from jobwarden.clock import SystemClock
from jobwarden.control.boot.reboot import ended_by_reboot
from jobwarden.control.shimproc import fork_shim, shim_alive
from jobwarden.control.views.joblist import live_processes, refresh
from jobwarden.errors import AccessDenied, JobStillRunning, JobwardenError, ProcessGone
from jobwarden.model import EndReason, JobState, ProcessId, Survivor
from jobwarden.osapi import asking
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.waiting import wait_readable
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.records import restart_never_made
from jobwarden.store.reserve import SpaceReserve, reserve_path


class StopResult(NamedTuple):
    run: RunRecord
    already_ended: bool
    survivors: list[Survivor]
    notes: tuple[str, ...] = ()  # what `stop` had to do besides asking (a stopped supervisor resumed)

    def to_json(self) -> dict[str, object]:
        """`stop --json`, and the web's answer to a stop."""
        return {
            "id": self.run.job_id,
            "run": self.run.n,
            "state": str(self.run.state),
            "already_ended": self.already_ended,
            "exit_code": self.run.exit_code,
            "signal": self.run.signal,
            "survivors": [s._asdict() for s in self.survivors],
            "notes": list(self.notes),
        }


def wait_for_shim(procfs: ProcFS, run: RunRecord, timeout_s: float | None) -> bool:
    """Block until the run's shim exits (pidfd: no polling, no pid reuse). False on timeout."""
    if not shim_alive(procfs, run.shim_pid, run.shim_start):
        return True
    assert run.shim_pid is not None
    try:
        fd = pidfds.open_pidfd(run.shim_pid)
    except ProcessGone:
        return True
    try:
        if not procfs.identity_matches(run.shim_pid, run.shim_start or -1):
            return True  # the pid was reused after we checked: the shim is gone
        return bool(wait_readable([fd], timeout_s))
    finally:
        pidfds.close(fd)


class StillRunning(JobwardenError):
    """`wait --timeout`: the job had not ended in time. Exit 124, as timeout(1)."""

    exit_code = 124

    def __init__(self, run: RunRecord, timeout_s: float) -> None:
        super().__init__(f"job {run.job_id} is still {run.state} after {config.format_duration(timeout_s)}")
        self.run = run


def wait_job(home: Path, procfs: ProcFS, job_ref: str, timeout_s: float | None = None) -> RunRecord:
    # No refresh before the wait: a dead shim ends it at once, and the refresh after it records `lost`.
    with Store(home) as store:
        job = store.job(job_ref)
        run = store.run(job.id)
    trace.info(f"waiting for supervisor {run.shim_pid} of job {job.id} ({run.state})")
    # a run of an earlier boot is over, whatever process has its supervisor's pid and start now
    if not ended_by_reboot(procfs, run) and not wait_for_shim(procfs, run, timeout_s):
        with Store(home) as store:
            raise StillRunning(store.run(job.id), timeout_s or 0.0)
    with Store(home) as store:
        return refresh(store, procfs, job, store.run(job.id))  # the last attempt: one shim runs them all


def stop(home: Path, procfs: ProcFS, job_ref: str, grace_s: float | None, again: bool = True) -> StopResult:
    with Store(home) as store:
        job = store.job(job_ref)
        run = refresh(store, procfs, job, store.run(job.id))
        if run.state.is_ended:
            return _stop_kept(procfs, run, grace_s if grace_s is not None else job.options.grace_s)
        if run.state == JobState.LOST:
            if restart_pending(store, run):
                return StopResult(_stop_pending_restart(store, run), False, [])
            if not live_processes(store, procfs, job, run):
                return StopResult(run, True, [])
            store.close()
            adopt(home, procfs, job.id)  # one code path: a new shim finds the survivors and stops them
            run = store_run(home, job, run.n)
        grace = grace_s if grace_s is not None else job.options.grace_s
    if run.shim_pid is None:
        run = _wait_for_shim_record(home, procfs, job, run)
        if run.state.is_ended:
            return StopResult(run, True, [])
    with Store(home) as store:
        request_stop(store, job.id, run.n, grace, SystemClock().wall())
    notes = _resume_if_stopped(procfs, run, set())
    _signal_shim(procfs, job, run)
    trace.info(f"asked supervisor {run.shim_pid} to stop job {job.id} (grace {grace:g}s); waiting for it")
    if not _wait_stopping(procfs, run, grace + 30, notes):
        raise JobwardenError(
            f"the supervisor of job {job.id} did not finish stopping it in {grace + 30:.0f}s",
            f"see {home}/jobs/{job.id}/run-{run.n}/shim.log",
        )
    with Store(home) as store:
        final = refresh(store, procfs, job, store.run(job.id, run.n))
        alive = live_processes(store, procfs, job, final) if final.state == JobState.LOST else []
    if alive and again:
        # its supervisor died while stopping it (killed, OOM): a job that ignores SIGTERM lives on, so a
        # new supervisor takes it over and stops it, rather than a success printed over a live job
        trace.info(f"the supervisor of job {job.id} died while stopping it; stopping it again")
        return stop(home, procfs, job_ref, grace_s, again=False)
    survivors = [Survivor(p.pid, p.cmdline, "its supervisor died while stopping it") for p in alive]
    return StopResult(final, False, final.survivors + survivors, tuple(sorted(notes)))


def request_stop(store: Store, job_id: int, n: int, grace_s: float, now: float) -> bool:
    """The stop request the shim reads when SIGUSR1 wakes it (shim.run.signals): on a run not over yet.
    False when the run had ended meanwhile."""
    return store.update_run(
        job_id,
        n,
        # stopping too: a second stop with a shorter grace (--force) cuts the first one's short
        only_if_state=(
            JobState.QUEUED,
            JobState.STARTING,
            JobState.RUNNING,
            JobState.RESTARTING,
            JobState.STOPPING,
        ),
        stop_requested_at=now,
        stop_grace=grace_s,
    )


def _stop_pending_restart(store: Store, run: RunRecord) -> RunRecord:
    """A restart its lost supervisor never made: nothing runs, and it never will once stopped."""
    now = SystemClock().wall()
    # lost -> stopped: the restart is called off (a concurrent `adopt` that started it wins instead)
    store.update_run_with_event(
        run.job_id,
        run.n,
        "ended",
        now,
        {"state": "stopped", "reason": "stopped during the restart backoff its supervisor died in"},
        only_if_state=(JobState.LOST,),
        state=JobState.STOPPED,
        end_reason=EndReason.STOPPED,
        ended_at=now,
        stop_requested_at=now,
    )
    return store.run(run.job_id, run.n)


def kept_alive(procfs: ProcFS, run: RunRecord) -> list[dict[str, Any]]:
    """The processes --keep-running left running at the run's end that still run (pid and start)."""
    return [k for k in run.kept if procfs.identity_matches(int(k["pid"]), int(k["start_time"]))]


def _stop_kept(procfs: ProcFS, run: RunRecord, grace_s: float) -> StopResult:
    """`stop` on a job that has ended: what it kept running (a TensorBoard) is what is left to end, each
    identity-checked (control.killer), with the same SIGTERM, grace, SIGKILL."""
    from jobwarden.control.killer import Killer, Target

    alive = kept_alive(procfs, run)
    if not alive:
        return StopResult(run, True, [])
    targets = []
    for kept in alive:
        pid, start = int(kept["pid"]), int(kept["start_time"])
        try:
            st = procfs.stat(pid)
        except (ProcessGone, AccessDenied):
            continue
        targets.append(Target(pid, start, procfs.uid(pid), st.pgid, str(kept.get("cmdline", ""))))
    results = Killer(procfs).terminate(targets, grace_s)
    survivors = [Survivor(r.pid, r.command, r.reason or "still alive") for r in results if not r.ended]
    ended = ", ".join(str(r.pid) for r in results if r.ended)
    notes = (f"ended what it kept running (--keep-running): pid {ended}",) if ended else ()
    return StopResult(run, True, survivors, notes)


def _wait_stopping(procfs: ProcFS, run: RunRecord, timeout_s: float, notes: set[str]) -> bool:
    """Wait for the shim to end the job and exit; a shim stopped meanwhile (SIGSTOP, Ctrl-Z) is resumed
    within a second, or it would never act on the request. False on timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    while not wait_for_shim(procfs, run, min(1.0, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return False
        notes |= _resume_if_stopped(procfs, run, notes)
    return True


def _resume_if_stopped(procfs: ProcFS, run: RunRecord, notes: set[str]) -> set[str]:
    """A stopped supervisor (state T) cannot act on a stop: SIGCONT it (identity-checked, through a
    pidfd), and say so. A traced one (t) is a debugger's to release: said at once, not after a timeout."""
    import signal

    assert run.shim_pid is not None
    try:
        st = procfs.stat(run.shim_pid)
    except (ProcessGone, AccessDenied):
        return notes
    if st.start_time != run.shim_start:
        return notes
    if st.state == "t":
        raise JobwardenError(
            f"the supervisor of job {run.job_id} (pid {run.shim_pid}) is held by a debugger (traced)",
            "detach the debugger from it, then stop the job again",
        )
    if st.state != "T":
        return notes
    try:
        fd = pidfds.open_pidfd(run.shim_pid)
    except ProcessGone:
        return notes
    try:
        if procfs.identity_matches(run.shim_pid, run.shim_start or -1):
            pidfds.send_signal(fd, run.shim_pid, signal.SIGCONT)
            trace.info(f"supervisor {run.shim_pid} of job {run.job_id} was stopped: sent it SIGCONT")
            return {
                *notes,
                f"its supervisor (pid {run.shim_pid}) was stopped (SIGSTOP): resumed it with SIGCONT",
            }
    finally:
        pidfds.close(fd)
    return notes


def _wait_for_shim_record(home: Path, procfs: ProcFS, job: JobRecord, run: RunRecord) -> RunRecord:
    """A job being started has no supervisor on record for a few milliseconds: its shim records itself
    once it has the job. Only then can it be asked to stop (it reads the request as it starts)."""
    import time

    deadline = time.monotonic() + config.SHIM_READY_TIMEOUT_S
    while run.shim_pid is None and not run.state.is_ended:
        if time.monotonic() > deadline:
            raise JobwardenError(
                f"job {job.id} has had no supervisor for {config.SHIM_READY_TIMEOUT_S:.0f}s",
                f"see {home}/jobs/{job.id}/run-{run.n}/shim.log",
            )
        time.sleep(0.02)  # a poll with a deadline: the shim announces itself through the store alone
        with Store(home) as store:
            run = refresh(store, procfs, job, store.run(job.id, run.n))
    return run


def store_run(home: Path, job: JobRecord, n: int) -> RunRecord:
    with Store(home) as store:
        return store.run(job.id, n)


def _signal_shim(procfs: ProcFS, job: JobRecord, run: RunRecord) -> None:
    """SIGUSR1 asks the shim to read its stop request. Only while it catches SIGUSR1: uncaught, its default
    action would end the supervisor and leave the job unwatched."""
    import signal

    assert run.shim_pid is not None
    shim = ProcessId(run.shim_pid, run.shim_start if run.shim_start is not None else -1)
    answer = asking.ask(procfs, shim, signal.SIGUSR1)
    if answer is asking.Answer.NOT_CAUGHT:
        raise JobwardenError(
            f"the supervisor of job {job.id} (pid {run.shim_pid}) was not asked to stop: {answer.value}",
            f"run `jobwarden stop {job.id}` again in a moment; if this repeats, see its "
            f"shim.log and `jobwarden status {job.id}`",
        )


def adopt(home: Path, procfs: ProcFS, job_ref: str | int) -> dict[str, object]:
    with Store(home) as store:
        job = store.job(job_ref)
        lock = store.layout.run_dir(job.id, store.run(job.id).n) / "adopt.lock"
    # Two adopts at once would start two supervisors of one job (and a later stop by one of them read
    # as an outside kill by the other): one at a time, and the second finds the job no longer lost.
    with _exclusive(lock, f"job {job.id} is being adopted by another jobwarden adopt"):
        return _adopt(home, procfs, job_ref)


@contextlib.contextmanager
def _exclusive(path: Path, busy: str) -> Iterator[None]:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobwardenError(busy, "wait for it to finish, then see jobwarden status") from None
        yield
    finally:
        os.close(fd)


def _adopt(home: Path, procfs: ProcFS, job_ref: str | int) -> dict[str, object]:
    with Store(home) as store:
        job = store.job(job_ref)
        run = refresh(store, procfs, job, store.run(job.id))
        if run.state != JobState.LOST:
            raise JobwardenError(
                f"job {job.id} is {run.state}: only a lost job (its supervisor died) can be adopted"
            )
        mode = "adopt"
        if not live_processes(store, procfs, job, run):
            if not restart_pending(store, run):
                raise JobwardenError(
                    f"job {job.id} is lost and none of its processes is alive",
                    "nothing to adopt; `jobwarden rm` removes it",
                )
            mode = "restart"  # its supervisor died in a restart's backoff: the restart is what is left
    with fork_shim(home, mode) as shim:
        trace.info(f"adopting job {job.id} run {run.n} with a new supervisor, pid {shim.pid} ({mode})")
        report = shim.start(job.id, run.n)
    if "error" in report:
        raise JobwardenError(f"cannot adopt job {job.id}: {report['error']}")
    if mode == "restart":
        pid = report.get("pid")
        return {**report, "run": run.n, "restarted": True, "pids": [pid] if pid else []}
    return report


def restart_pending(store: Store, run: RunRecord) -> bool:
    """Its supervisor died in a restart's backoff: the restart is what is left to do (store.records)."""
    if run.state != JobState.LOST or run.pid is not None:  # the events only when it may be so
        return False
    return restart_never_made(run, [e.kind for e in store.events(run.job_id, run.n)])


def remove(home: Path, procfs: ProcFS, job_ref: str) -> int:
    with Store(home) as store:
        job = store.job(job_ref)
        run = refresh(store, procfs, job, store.run(job.id))
        if run.state.is_active or (run.state == JobState.LOST and live_processes(store, procfs, job, run)):
            raise JobStillRunning(f"job {job.id} is {run.state}", f"stop it first: jobwarden stop {job.id}")
        if kept_alive(procfs, run):
            raise JobStillRunning(
                f"job {job.id} has ended, but processes it kept running (--keep-running) still run",
                f"end them first: jobwarden stop {job.id}",
            )
        store.delete_job(job.id)
        for n in range(1, run.n + 1):  # space reserves a killed shim left (store.reserve)
            SpaceReserve(reserve_path(store.layout.database, job.id, n)).release()
        import shutil  # here only: with the compression modules it pulls in, ~10 ms of every `wait`

        shutil.rmtree(store.layout.job_dir(job.id), ignore_errors=True)
    return job.id

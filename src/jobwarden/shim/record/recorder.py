"""What the shim writes about its run while the run goes on, and how the run ended.

None of these writes may take the supervisor down: a full disk or a locked database costs a sample, never
the job. The events that explain a run (a disk-full episode, the run's end) wait in memory, or are
retried, until the store takes them.

Nor may a write hold the loop up. Another process that keeps the database's write lock (an open `sqlite3`
shell, a slow backup) used to stop the loop inside a write for as long: a job that ended meanwhile was
seen to end, and recorded as ending, when the lock was let go (a 5 s job "ran" 45 s). A write now waits
at most WAIT_S; one the lock refuses is kept, in order, with the time it was made, and written once the
lock is free. The loop goes on watching at the real times.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobwarden import config
from jobwarden.clock import Clock
from jobwarden.errors import StoreBusy, StoreError, StoreFull
from jobwarden.model import EndReason, JobState, Survivor
from jobwarden.osapi.process import WaitStatus
from jobwarden.store import JobRecord, Store
from jobwarden.store.logfiles import LogWatcher
from jobwarden.store.reserve import SpaceReserve, reserve_path

if TYPE_CHECKING:
    from jobwarden.rules.speed.evidence import SpeedEvidence
    from jobwarden.shim.record.groupsink import GroupSink

END_RETRY_S = 5.0  # how often the end of a run is offered again to a store that refuses it
WAIT_S = 0.05  # how long a write of the loop waits for another process's write lock before it is kept
BUSY_RETRY_S = 0.5  # after the lock refused a write, the next writes are kept without asking for so long
MAX_DEFERRED = 20_000  # writes kept while the lock is held (hours of samples): past it, samples are dropped
Write = tuple[Callable[..., object], tuple[Any, ...], dict[str, Any]]


def log(message: str) -> None:
    """The shim's own log (its stdout/stderr go to shim.log). It sits on the disk that may be full: a
    failed log line must never take the supervisor down."""
    with contextlib.suppress(OSError):
        print(time.strftime("%Y-%m-%d %H:%M:%S"), message, file=sys.stderr, flush=True)


class RunRecorder:
    def __init__(self, store: Store, job_id: int, run: int, logs: LogWatcher, clock: Clock) -> None:
        self.store, self.job_id, self.run, self.logs, self.clock = store, job_id, run, logs, clock
        self._disk_full = False
        self._pending: list[tuple[str, float, dict[str, Any]]] = []
        self._deferred: collections.deque[Write] = collections.deque()  # refused by the lock: in order
        self._busy_until = 0.0  # monotonic: the lock refused a write; keep the next ones without asking
        self.reserve = SpaceReserve(reserve_path(store.layout.database, job_id, run))  # room for the end
        self.group: GroupSink | None = None  # a --group run's shared records: fed from what is recorded here

    def open_group(self, job: JobRecord) -> None:
        if job.options.group:
            from jobwarden.shim.record.groupsink import GroupSink

            self.group = GroupSink(self.store, job, self.run, self.clock, log)

    def started(self, at: float, pid: int, start_time: int) -> None:
        """The job's main process exists (the store has it already, with the run's new state)."""
        self._to_group(lambda group: group.started(at, pid, start_time))

    def write(self, method: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
        """`method(job_id, run, *args, **kwargs)`, a Store method: written now, or kept to be written in
        order once another process lets go of the write lock (True either way); False when the store
        refused it (a full disk, a corrupt database)."""
        try:
            if not self.flush():  # the writes kept earlier go first
                return self._defer((method, args, kwargs))
            try:
                self._write_now((method, args, kwargs))
            except StoreBusy:
                return self._defer((method, args, kwargs))
            except StoreError as err:
                log(f"store write failed: {err}")
                return False
        finally:
            if method == self.store.record_tree:  # (now, live, ended, ...): ranks come and go
                self._to_group(lambda group: group.tree(args[0], args[1], args[2]))
        return True

    def flush(self, patient: bool = False) -> bool:
        """The writes kept while the lock was held, oldest first; False while it still is. `patient`:
        wait for the lock as long as any write of the store does (the run's end, nothing left to watch)."""
        if not patient and self._deferred and self.clock.monotonic() < self._busy_until:
            return False
        while self._deferred:
            try:
                self._write_now(self._deferred[0], patient)
            except StoreBusy:
                return False
            except StoreError as err:
                log(f"a write kept while the database was locked failed: {err}")
            self._deferred.popleft()
        return True

    def _write_now(self, write: Write, patient: bool = False) -> None:
        method, args, kwargs = write
        if patient:
            method(self.job_id, self.run, *args, **kwargs)
            return
        try:
            with self.store.waiting_at_most(WAIT_S):
                method(self.job_id, self.run, *args, **kwargs)
        except StoreBusy:
            self._busy_until = self.clock.monotonic() + BUSY_RETRY_S
            raise

    def _defer(self, write: Write) -> bool:
        if len(self._deferred) >= MAX_DEFERRED:
            return False  # the caller keeps what it can (the sampler its points); the rest is lost
        if not self._deferred:
            log("the database is locked by another process: writes wait in memory, each with its own time")
        self._deferred.append(write)
        return True

    def event(self, kind: str, at: float, **data: Any) -> bool:
        self._to_group(lambda group: group.event(kind, at, data))
        return self.write(self.store.add_event, kind, at, **data)

    def check_disk(self, now: float) -> None:
        """Record when the log's filesystem fills up and when it has room again. The job's own writes fail
        meanwhile (we cannot help that), but the episode is shown in `status`. The events wait in memory
        until the store can take them: the database usually sits on the same full disk."""
        free = self.logs.free_bytes()
        if free is not None and (free < config.LOW_DISK_BYTES) != self._disk_full:
            self._disk_full = not self._disk_full
            kind = "disk-full" if self._disk_full else "disk-ok"
            path = str(self.logs.output.parent)
            self._pending.append((kind, now, {"free_bytes": free, "path": path}))
            log(f"{kind}: {free} bytes free under {path}")
        self._flush_pending()

    def _flush_pending(self) -> None:
        while self._pending:
            kind, at, data = self._pending[0]
            if not self.event(kind, at, **data):
                break
            self._pending.pop(0)

    def end(self, fields: dict[str, Any], orphans: list[dict[str, Any]], survivors: list[Survivor]) -> None:
        """-> succeeded | failed | stopped | lost: retried until it lands, so a full disk loses nothing. A
        disk the job filled has room for it: the space reserve is freed for it (store.reserve)."""
        fields = {**fields, "orphans_left": orphans, "survivors": [s._asdict() for s in survivors]}
        try:
            self._record_end(fields, orphans, survivors)
        finally:
            self.reserve.release()
        self._to_group(lambda group: group.end(fields))

    def _record_end(
        self, fields: dict[str, Any], orphans: list[dict[str, Any]], survivors: list[Survivor]
    ) -> None:
        for attempt in range(100_000):
            # a disk-full episode first: it explains the run (the disk is looked at once: the room the
            # reserve frees is no sign that the disk has room again)
            if attempt == 0:
                self.check_disk(self.clock.wall())
            else:
                self._flush_pending()
            try:
                if not self.flush(patient=True):  # what waited for the lock goes first, in order
                    raise StoreBusy("the database is still locked", "")
                self.store.update_run(self.job_id, self.run, **fields)
                self.store.add_event(
                    self.job_id,
                    self.run,
                    "ended",
                    fields["ended_at"],
                    state=str(fields["state"]),
                    exit_code=fields["exit_code"],
                    signal=fields["signal"],
                    orphans=len(orphans),
                    survivors=len(survivors),
                )
                return
            except StoreFull as err:
                if self.reserve.release():
                    log(f"no room for the end of the run: freed the space kept for it ({err})")
                    continue  # at once: what was freed is the end's
                self._wait_to_retry(attempt, err)
            except StoreError as err:
                self._wait_to_retry(attempt, err)

    def _wait_to_retry(self, attempt: int, err: StoreError) -> None:
        if attempt == 0:
            log(f"cannot record the end of the run yet, retrying every {END_RETRY_S:g}s: {err}")
        time.sleep(END_RETRY_S)

    def rank_views(self, at: float, ev: SpeedEvidence) -> None:
        """The ranks of the speed watch's latest judgement, for the straggler across nodes."""
        self._to_group(lambda group: group.rank_views(at, ev))

    def _to_group(self, feed: Callable[[GroupSink], object]) -> None:
        """The group records are a copy for `explain --group`: no fault of theirs may reach the job."""
        if self.group is None:
            return
        try:
            feed(self.group)
        except Exception as err:
            log(f"group records: {type(err).__name__}: {err}")


def end_fields(main_status: int | None, stop_reason: EndReason | None, now: float) -> dict[str, Any]:
    """The run's final columns from the main process's wait status (-1: it ended unseen) and why the shim
    stopped it, if it did."""
    fields: dict[str, Any] = {"ended_at": now, "exit_code": None, "signal": None, "wait_status": None}
    if main_status is not None and main_status >= 0:
        status = WaitStatus.decode(main_status)
        fields.update(exit_code=status.exit_code, signal=status.signal_name, wait_status=status.raw)
    if stop_reason is not None:
        # the engine's stop (scancel, a time limit) is a stop, not a failure of the job
        stopped = stop_reason in (EndReason.STOPPED, EndReason.ENGINE_STOP)
        state = JobState.STOPPED if stopped else JobState.FAILED
        return {**fields, "state": state, "end_reason": stop_reason}
    if fields["wait_status"] is None:
        return {
            **fields,
            "state": JobState.LOST,
            "end_reason": EndReason.UNKNOWN,
            "error": "the main process ended while unsupervised; its exit status is unknown",
        }
    if fields["signal"]:
        return {**fields, "state": JobState.FAILED, "end_reason": EndReason.SIGNALLED}
    state = JobState.SUCCEEDED if fields["exit_code"] == 0 else JobState.FAILED
    return {**fields, "state": state, "end_reason": EndReason.EXITED}

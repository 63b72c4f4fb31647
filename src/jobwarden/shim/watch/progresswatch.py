"""The run's progress, watched by its shim: read from the job's sources each tick, measured on the
shim's clock, stored, and turned into a sign for the hang watchdog and `stalled`/`recovered` events.

Sources (progress.sources chooses): the heartbeat file, the hooks' `<pid>.progress` records of the live
processes (read again only when their mtime changed), and the newest bytes of output.log. The shim never
reads the job's output through a pipe (the job writes its own file, DESIGN.md): it reads at most
TAIL_BYTES of the log's end per tick with pread, however fast the job prints; only the newest frames
matter, and progress.output keeps what older reads showed.

A step counter that has moved regularly is the best sign of progress there is: a spin or a busy-waiting
collective burns CPU while it stands still. While one runs (moved several times, not finished, and the
hang window is long against its pace), the watchdog counts only its movement (watchdog.Progress.step_*),
and `stalled` is recorded and notified when it stands still that long while the job looks busy.
"""

from __future__ import annotations

import codecs
import contextlib
import os
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden.config import format_duration
from jobwarden.probes.pyhooks import PROGRESS_SUFFIX, progress_mtime, read_heartbeat, read_progress
from jobwarden.progress.epochs import with_hints
from jobwarden.progress.hints import from_command
from jobwarden.progress.model import HookProgress, Progress, Reading, epoch_number
from jobwarden.progress.output import OutputProgress
from jobwarden.progress.sources import (
    Candidate,
    bar_reading,
    choose,
    heartbeat_reading,
    in_process,
    in_process_activity,
    output_candidate,
)
from jobwarden.progress.stepclock import StepClock
from jobwarden.shim.record.recorder import RunRecorder, log
from jobwarden.shim.watch.rankwatch import RankHints
from jobwarden.store import JobRecord, Store

if TYPE_CHECKING:
    from jobwarden.shim.record.notify import Notifier

TAIL_BYTES = 64 << 10  # per tick: a few hundred frames, enough for every bar of every rank
STALL_MIN_S = 120.0  # standing still shorter than this is a pause (a checkpoint, an evaluation without a bar)
STALL_PACES = 20  # ... and shorter than this many of its usual intervals
HANG_PACES = 3  # the watchdog trusts a counter only when its hang window holds this many intervals
RANK_BEAT_SUFFIX = ".rank"  # jobwarden.heartbeat's: a rank's own beat beside the job's heartbeat file
MAX_RANK_BEATS = 64
REWRITE_S = 10.0  # an unchanged progress is rewritten this often (its rate moves)


class OutputTail:
    """The newest bytes of output.log, read with pread from an fd of its own (never the job's pipe: there
    is none), with whether they follow what the previous read returned."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self) -> tuple[str, bool] | None:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            size = os.fstat(self.fd).st_size
            if size == self.offset:
                return None
            if size < self.offset:  # cut down (a rotated log): start again from what is there
                self.offset = 0
            start = max(self.offset, size - TAIL_BYTES)
            follows = start == self.offset
            # a skip reads from one byte early: when that byte ends a frame, the first one read is whole
            early = 0 if follows else 1
            data = os.pread(self.fd, size - start + early, start - early)
        except OSError:
            return None
        if not follows:
            self._decoder.reset()  # a character cut by the skip is the first frame's, dropped anyway
        self.offset = start - early + len(data)
        return self._decoder.decode(data), follows

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class ProgressWatch:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        run: int,
        record: RunRecorder,
        window_s: float | None,
        notifier: Notifier | None = None,
    ) -> None:
        layout = store.layout
        self.store, self.job, self.run, self.record, self.notifier = store, job, run, record, notifier
        self.window_s = window_s
        self.tail = OutputTail(layout.output_log(job.id, run))
        self.py_dir = layout.py_dir(job.id, run) if job.options.py_hooks else None
        self.heartbeat_path = layout.heartbeat_file(job.id, run)
        self.output = OutputProgress()
        self.hints = from_command(job.command)  # epochs and rounds the job passed (progress.hints)
        self._zero_epoch = False  # the job's epoch labels count from 0 (progress.epochs)
        self.records: dict[int, HookProgress] = {}
        self._mtimes: dict[int, int] = {}
        self._heartbeat: tuple[float, Reading | None] | None = None  # (mtime, what it said)
        self._rank_beats: dict[int, tuple[float, int | None]] = {}  # rank: (mtime, its beat's step)
        self.clock = StepClock()
        self.current: Progress | None = None
        self._reading: Reading | None = None
        self._changed_at = 0.0
        self._first_step: int | None = None
        self._activity: object = None
        self.moves = 0  # any bar of any source moved: the job advanced
        self._moved_at: float | None = None  # monotonic
        self._gaps: deque[float] = deque(maxlen=8)
        self._stalled_since: float | None = None  # wall time
        self._moves_at_stall = 0
        self._written_key: tuple[Any, ...] | None = None
        self._written_rate: float | None = None
        self._written_at = -REWRITE_S

    # --- each tick ----------------------------------------------------------------------------------

    def tick(self, now: float, now_mono: float, pids: Iterable[int], busy: bool) -> Progress | None:
        """Read the sources, measure, store; returns the run's progress (None while it shows none)."""
        self._read_output()
        self._read_records(pids)
        chosen = self._choose()
        self._note_activity(now_mono)
        if chosen is None:
            return None
        self._update(chosen, now, now_mono, busy)
        self._store(now)
        return self.current

    def steps_by_pid(self) -> dict[int, int]:
        """Each process's own step counter where the hooks saw a bar in it (a rank's: DESIGN "Ranks"):
        its innermost open bar, the one that moves every step."""
        found = {}
        for pid, record in self.records.items():
            bars = sorted((b for b in record.bars if not b.closed), key=lambda b: b.position)
            if bars:
                found[pid] = bars[-1].n
        return found

    def rank_hints(self) -> RankHints:
        """What the progress sources say of each rank (shim.watch.rankwatch): each process's own step
        counter where the hooks saw a bar in it, the rank their records name (a rank started with no
        launcher's variable: mp.spawn), and each rank's step where its output lines carry a prefix."""
        ranks = {pid: r.rank for pid, r in self.records.items() if r.rank is not None}
        return RankHints(self.steps_by_pid(), ranks, self.output.steps_by_rank(), self._rank_beat_steps())

    def _rank_beat_steps(self) -> dict[int, int]:
        """Each rank's step from its own heartbeat: `jobwarden.heartbeat(step=...)` in a process with RANK
        also writes `<heartbeat>.rank<N>` (the job's file keeps whichever rank beat last). A file is read
        again only when it changed; at most MAX_RANK_BEATS ranks."""
        prefix = self.heartbeat_path.name + RANK_BEAT_SUFFIX
        try:
            names = [n for n in os.listdir(self.heartbeat_path.parent) if n.startswith(prefix)]
        except OSError:
            return {}
        ranks = sorted(int(n[len(prefix) :]) for n in names if n[len(prefix) :].isdigit())[:MAX_RANK_BEATS]
        steps = {}
        for rank in ranks:
            path = self.heartbeat_path.with_name(f"{prefix}{rank}")
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            known = self._rank_beats.get(rank)
            if known is None or known[0] != mtime:
                beat = read_heartbeat(path)
                reading = heartbeat_reading(beat.info) if beat else None
                known = self._rank_beats[rank] = (mtime, reading.step if reading else None)
            if known[1] is not None:
                steps[rank] = known[1]
        return steps

    def finish(self, now: float, now_mono: float) -> None:
        """The run ended: a last look at every source (the records of processes that ended too), stored."""
        self._read_output()
        if self.py_dir is not None:
            self._read_records(_pids_with_records(self.py_dir), keep_gone=True)
        chosen = self._choose()
        if chosen is not None:
            self._update(chosen, now, now_mono, busy=False)
            self._store(now, force=True)
        self.tail.close()

    def _read_output(self) -> None:
        got = self.tail.read()
        if got is not None:
            self.output.feed(*got)

    def _choose(self) -> Candidate | None:
        """The sources' best reading, with the metrics of all of them and the counts of the command."""
        self._zero_epoch = self._zero_epoch or self.output.zero_epoch or _labels_from_zero(self.records)
        hooks = in_process(list(self.records.values()), self._zero_epoch)
        chosen = choose(self._heartbeat_reading(), hooks, self._from_output(), self.output.metrics())
        if chosen is None:
            return None
        return chosen._replace(reading=with_hints(chosen.reading, self.hints))

    def _from_output(self) -> Candidate | None:
        found = self.output.main()
        return output_candidate(*found) if found else None

    def _read_records(self, pids: Iterable[int], keep_gone: bool = False) -> None:
        if self.py_dir is None:
            return
        live = set(pids)
        for pid in live:
            mtime = progress_mtime(self.py_dir, pid)
            if mtime is None or mtime == self._mtimes.get(pid):
                continue
            found = read_progress(self.py_dir, pid)
            if found is not None:  # else read again next time (a file replaced as it was read)
                self._mtimes[pid], self.records[pid] = mtime, found
        if not keep_gone:  # a process that ended shows no bar any more (its last state was read)
            for pid in set(self.records) - live:
                del self.records[pid]
                self._mtimes.pop(pid, None)  # read again at the end

    def _heartbeat_reading(self) -> Reading | None:
        try:
            mtime = self.heartbeat_path.stat().st_mtime
        except OSError:
            return None
        if self._heartbeat is None or self._heartbeat[0] != mtime:
            beat = read_heartbeat(self.heartbeat_path)
            self._heartbeat = (mtime, heartbeat_reading(beat.info) if beat else None)
        return self._heartbeat[1]

    def _note_activity(self, now_mono: float) -> None:
        """Any bar of any source with a new count (the outer bar of an epoch loop moves once an epoch,
        its inner bar all the time): the job advanced."""
        beat = self._heartbeat[1] if self._heartbeat else None
        activity = (self.output.moves, in_process_activity(list(self.records.values())), beat and beat.step)
        if activity == self._activity:
            return
        first = self._activity is None
        self._activity = activity
        if first:
            self._moved_at = now_mono
            return
        if self._moved_at is not None:
            self._gaps.append(now_mono - self._moved_at)
        self._moved_at = now_mono
        self.moves += 1

    def _update(self, chosen: Candidate, now: float, now_mono: float, busy: bool) -> None:
        reading = chosen.reading
        # the run's own count of steps (this epoch's and those before it): a rate that goes on across
        # epochs, where a bar per epoch starts again from 0
        self.clock.observe(now_mono, _run_steps(reading), chosen.key)
        if reading != self._reading:
            self._reading, self._changed_at = reading, now
        if self._first_step is None and reading.step is not None:
            # the log's first frame of the bar may be older than this first look (a resumed run began
            # at 600, was seen at 620)
            logged = self.output.first_step(chosen.rank, reading.label, reading.total)
            self._first_step = reading.step if logged is None else min(logged, reading.step)
        self._judge_stall(reading, now, now_mono, busy)
        self.current = Progress(
            step=reading.step,
            total=reading.total,
            rate=None if reading.finished else self.clock.rate(now_mono),
            unit=reading.unit,
            epoch=reading.epoch,
            metrics=reading.metrics,
            source=chosen.source,
            format=reading.format,
            at=self._changed_at,
            label=reading.label,
            observed=chosen.observed,
            rank=chosen.rank,
            closed=reading.closed,
            first_step=self._first_step,
            stalled_since=self._stalled_since,
            epochs=reading.epochs,
            per_epoch=reading.per_epoch,
        )

    # --- standing still -----------------------------------------------------------------------------

    def pace(self) -> float | None:
        """The usual time between two moves of the job's counters (None before a few moves)."""
        return sum(self._gaps) / len(self._gaps) if len(self._gaps) >= 2 else None

    def counting(self) -> bool:
        """A step counter runs: it moved regularly, it is not finished, and the hang window holds
        several of its intervals (a counter that moves every 5 minutes says nothing in 10)."""
        pace = self.pace()
        if pace is None or self._reading is None or self._reading.finished:
            return False
        return self.window_s is None or self.window_s >= HANG_PACES * pace

    def still_for(self, now_mono: float) -> float | None:
        return None if self._moved_at is None else max(now_mono - self._moved_at, 0.0)

    def _stall_after(self) -> float:
        pace = self.pace() or 0.0
        after = max(STALL_MIN_S, STALL_PACES * pace)
        return min(after, self.window_s) if self.window_s else after

    def _judge_stall(self, reading: Reading, now: float, now_mono: float, busy: bool) -> None:
        still = self.still_for(now_mono) or 0.0
        if self._stalled_since is not None:
            if self.moves != self._moves_at_stall:
                # stalled -> moving again
                stalled_for = now - self._stalled_since
                self._stalled_since = None
                self._event("recovered", now, reading, stalled_for)
            return
        if self.counting() and busy and still >= self._stall_after():
            # moving -> stalled: the counter stands still while the job burns CPU or GPU
            self._stalled_since, self._moves_at_stall = now - still, self.moves
            self._event("stalled", now, reading, still)

    def _event(self, kind: str, now: float, reading: Reading, seconds: float) -> None:
        where = _where(reading)
        self.record.event(
            f"progress-{kind}", now, step=reading.step, total=reading.total, seconds=round(seconds, 1)
        )
        if kind == "stalled":
            text = f"{where}, no step for {format_duration(seconds)} while busy"
        else:
            text = f"{where} again after {format_duration(seconds)} without a step"
        log(f"progress {kind}: {text}")
        if self.notifier is not None:
            from jobwarden.shim.record.notify import event_payload

            self.notifier.deliver(
                event_payload(kind, self.job.id, self.job.name, self.run, "running", finding=text)
            )

    def note(self, now_mono: float) -> str | None:
        """For the hang's evidence: where the counter stands and since when."""
        if self._reading is None or self._reading.step is None:
            return None
        still = self.still_for(now_mono)
        pace = self.pace()
        text = f"the step counter stands at {_where(self._reading)}"
        if still is not None:
            text += f", unmoved for {format_duration(still)}"
        if pace:
            text += f" (it had moved every {pace:.1f}s)"
        return text

    # --- the store ------------------------------------------------------------------------------------

    def _store(self, now: float, force: bool = False) -> None:
        p = self.current
        if p is None:
            return
        key = (
            p.step,
            p.total,
            p.metrics,
            p.closed,
            p.label,
            p.epoch,
            p.epochs,
            p.stalled_since,
            p.format,
            p.rank,
        )
        same = key == self._written_key and not _moved(p.rate, self._written_rate)
        if same and not force and now - self._written_at < REWRITE_S:
            return
        if self.record.write(self.store.set_progress, p):
            self._written_key, self._written_rate, self._written_at = key, p.rate, now


def _moved(rate: float | None, before: float | None) -> bool:
    if rate is None or before is None:
        return rate != before
    return abs(rate - before) > 0.05 * max(abs(before), 1e-9)


def _where(reading: Reading) -> str:
    if reading.step is None:
        return "no step"
    if reading.total:
        return f"step {reading.step}/{reading.total} ({100 * reading.step / reading.total:.0f}%)"
    return f"step {reading.step}"


def _run_steps(reading: Reading) -> int | None:
    """The step counter the clock measures: for a bar per epoch, the epochs before this one added (its
    count need not be known), so that the rate does not start over with each epoch."""
    n = epoch_number(reading.epoch, reading.epochs)
    if not reading.per_epoch or n is None or reading.step is None or not reading.total:
        return reading.step
    return (n - 1) * reading.total + min(reading.step, reading.total)


def _labels_from_zero(records: dict[int, HookProgress]) -> bool:
    """A bar the hooks saw described as epoch 0 (Lightning's "Epoch 0"): the job counts epochs from 0."""
    return any(bar_reading(bar).epoch == 0 and bar.kind == "tqdm" for r in records.values() for bar in r.bars)


def _pids_with_records(py_dir: Path) -> list[int]:
    try:
        names = os.listdir(py_dir)
    except OSError:
        return []
    return [
        int(n.removesuffix(PROGRESS_SUFFIX))
        for n in names
        if n.endswith(PROGRESS_SUFFIX) and n[:-9].isdigit()
    ]


class StepSign:
    """The progress watch as the hang watchdog reads it each tick: does a counter run, did it move?"""

    def __init__(self, watch: ProgressWatch) -> None:
        self.watch = watch
        self._seen = watch.moves

    def read(self) -> tuple[bool, bool]:
        moved = self.watch.moves != self._seen
        self._seen = self.watch.moves
        return self.watch.counting(), moved

    def note(self, now_mono: float) -> str | None:
        return self.watch.note(now_mono)

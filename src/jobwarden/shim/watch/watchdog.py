"""When is a run hung? When for a whole window none of its signs of progress moved.

Signs of progress, cheapest first: new output, a heartbeat (the file named by JOBWARDEN_HEARTBEAT_FILE,
touched by any language or written by `jobwarden.heartbeat()`), CPU time, I/O bytes, GPU utilisation.
A deadlocked tree shows none of them. CPU and I/O count only above a small floor: an idle
`multiprocessing.Pool` parent still wakes ten times a second (its worker-handler thread polls), which must
not look like work.

Blind spot, said plainly: NCCL busy-waits, so a collective hang burns CPU and GPU at 100% and is not
"quiet"; only a heartbeat (or output) that stops reveals it, or a step counter: while the job shows one
that runs (shim.watch.progresswatch), its movement is the only sign that counts.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from jobwarden.verdict.signs import CPU_FLOOR_PERCENT, GPU_FLOOR_PERCENT, IO_FLOOR_BYTES

_T = TypeVar("_T", int, float)


class Progress(NamedTuple):
    """One observation of the run's signs of progress. None: not known this time."""

    output_bytes: int | None = None
    heartbeat_at: float | None = None
    cpu_percent: float | None = None  # summed over the tree, since the previous observation
    io_bytes: int | None = None  # cumulative rchar + wchar of the live members
    gpu_util_percent: float | None = None
    step_active: bool = False  # a step counter runs (shim.watch.progresswatch): only its movement is progress
    step_moved: bool = False


class ProgressTracker:
    """Feed it observations (monotonic time); it says how long the run has been quiet and when a hang
    should be reported: once per quiet spell, re-armed by the next sign of progress."""

    def __init__(self, window_s: float | None, now: float) -> None:
        self.window_s = window_s
        self.last_progress_at = now
        self.last_kind: str | None = None
        self._last = Progress()
        self._reported = False
        self._discount_until = float("-inf")
        self._io_rebase = False

    def discount(self, until: float) -> None:
        """jobwarden's own probing makes the job work a little: a rank asked for its flight recorder
        symbolises its stacks (~1 CPU-s, once) and writes the answer. Until `until` (monotonic) neither CPU
        nor I/O counts as progress, and the next I/O reading after it is a new baseline: a hung job must
        not look recovered because it answered."""
        self._discount_until = until
        self._io_rebase = True

    def observe(self, now: float, seen: Progress) -> str | None:
        """Record an observation; returns the kind of progress it shows, if any."""
        discounting = now < self._discount_until
        if discounting:
            seen = seen._replace(cpu_percent=None)
        if seen.io_bytes is not None and self._io_rebase:
            self._last = self._last._replace(io_bytes=None)  # a baseline, not a step up
            self._io_rebase = discounting
        kind = self._progress_kind(seen)
        self._last = Progress(
            output_bytes=_keep(seen.output_bytes, self._last.output_bytes),
            heartbeat_at=_keep(seen.heartbeat_at, self._last.heartbeat_at),
            # I/O is read only every few ticks: the last reading stays the baseline in between (dropped,
            # a job that only writes and fsyncs, printing nothing, was never seen progressing)
            io_bytes=_keep(seen.io_bytes, self._last.io_bytes),
        )
        if kind:
            self.last_progress_at, self.last_kind, self._reported = now, kind, False
        return kind

    def _progress_kind(self, seen: Progress) -> str | None:
        if seen.step_active:  # a spin or a busy-waiting collective burns CPU and prints the same frame
            return "step" if seen.step_moved else None
        last = self._last
        if _grew(seen.output_bytes, last.output_bytes):
            return "output"
        if _grew(seen.heartbeat_at, last.heartbeat_at):
            return "heartbeat"
        if seen.cpu_percent is not None and seen.cpu_percent >= CPU_FLOOR_PERCENT:
            return "cpu"
        if (
            seen.io_bytes is not None
            and last.io_bytes is not None
            and seen.io_bytes - last.io_bytes >= IO_FLOOR_BYTES
        ):
            return "io"
        if seen.gpu_util_percent is not None and seen.gpu_util_percent >= GPU_FLOOR_PERCENT:
            return "gpu"
        return None

    def quiet_for(self, now: float) -> float:
        return max(0.0, now - self.last_progress_at)

    def hang_due(self, now: float) -> bool:
        """The window has passed with no progress and this quiet spell was not reported yet."""
        return self.window_s is not None and not self._reported and self.quiet_for(now) >= self.window_s

    def due_at(self) -> float | None:
        """When a hang becomes due if nothing moves before (monotonic), None when none can be."""
        if self.window_s is None or self._reported:
            return None
        return self.last_progress_at + self.window_s

    def mark_reported(self) -> None:
        self._reported = True


def _grew(new: float | None, old: float | None) -> bool:
    """A first reading is a baseline, not progress: a job that printed at start then froze is hung."""
    return new is not None and old is not None and new > old


def _keep(new: _T | None, old: _T | None) -> _T | None:
    return new if new is not None else old

"""`periodic-stall`: progress stops at regular intervals (a checkpoint, an evaluation, a flush of the logs)
for a large share of the time. From the step counter's moves as the shim saw them, two ways:

- long stalls: a gap far longer than the usual one is a stall; stalls that come back every so many steps
  are periodic (research/slowness.md 2.12: heartbeat inter-arrival times turn bimodal), judged over the
  moves kept (minutes: a checkpoint every few minutes);
- short pauses, judged by the share of time they cost, not by their length: a counter that moves several
  steps between two of the shim's looks when it runs, and then is found still at a look, paused for
  several of its step times (the jitter of a step or a late look never leaves a look with no move). Pauses
  that recur every so many steps and cost at least PAUSE_SHARE of the last PAUSE_WINDOW_S are a stall
  however short each is: a 1.5 s checkpoint after every second of steps loses 60 % of the time. Looks once
  a second see part of it (a pause between two looks is missed): the share said is a floor.

Which function stalls: the shim dumps the loop process's main thread once during each stall (when the
counter has stood still for as long as a stall here, shim.watch.stacksample), and the finding names the frame
most of those dumps show: the innermost frame of the job's own code (not the standard library, an installed
package, torch or jobwarden), where the job called into whatever took the time (research 5.7: a
`torch.save` stall shows `save`/`_save` of torch/serialization.py under the job's own function). Dumps
that disagree, or that show none of the job's code, name nothing; the counter still tells when, how long
and what it costs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from jobwarden.model import Finding
from jobwarden.observations import Frame
from jobwarden.rules.frames import is_library
from jobwarden.rules.speed import averages
from jobwarden.rules.speed.evidence import SpeedEvidence, StackSample, StepMove

STALL_TIMES = 4.0  # a gap this many times the usual one is a stall ...
STALL_MIN_S = 3.0  # ... and at least this long (the shim looks once a second)
MIN_MOVES = 10  # fewer moves say nothing of the usual gap
MIN_STALLS = 3
REGULAR = 0.25  # the steps between stalls vary by at most this share of their mean
SHARE = 0.10  # the stalls cost at least this share of the time
MIN_AGREE = 2  # stall samples that must show the same frame (and more than half of them) to name it
HOLD_STALLS = 2  # while the shim dumps stalls, wait up to this many more stalls for samples to name one
PAUSE_WINDOW_S = 30.0  # short pauses are judged over the last seconds of moves: a new habit shows at once
PAUSE_STEPS = 3  # the counter moves at least this many steps a look when it runs (median): a still look is
# then a pause of three step times or more, never one slow step
RUNNING_GAPS = 3  # gaps with no still look that tell the usual one (a job that pauses after each second
# of steps shows one such gap for two with a pause)
PAUSE_SHARE = 0.15  # the pauses cost at least this share of the window (as the looks see them: a pause
# between two looks is missed, a 1.5 s checkpoint after each second of steps shows 15-40 % of its 60 %)
PAUSE_SPREAD = 0.15  # the steps between pauses are within this share of a multiple of the typical (median)

# not the job's own code, besides the standard library and installed packages (rules.frames.is_library):
# torch built from a source tree, and jobwarden itself (the hooks, a heartbeat being written)
_TORCH = "/torch/"
_JOBWARDEN = tuple({str(Path(__file__).parents[2]) + "/", str(Path(__file__).resolve().parents[2]) + "/"})


def usual_gap(moves: Sequence[StepMove]) -> float | None:
    """The median time between two moves of the counter; None with too few moves (or none apart)."""
    if len(moves) < MIN_MOVES:
        return None
    usual = averages.median(b.at - a.at for a, b in pairwise(moves))
    return usual if usual > 0 else None


def stall_after(usual: float) -> float:
    """How long the counter stands still before it is a stall."""
    return max(STALL_TIMES * usual, STALL_MIN_S)


def stalls(moves: Sequence[StepMove]) -> tuple[float, list[tuple[StepMove, float]]] | None:
    """(the usual gap, [(the move a stall began after, its length)]) or None with too few moves."""
    usual = usual_gap(moves)
    if usual is None:
        return None
    return usual, [(a, b.at - a.at) for a, b in pairwise(moves) if b.at - a.at >= stall_after(usual)]


class StallFrame(NamedTuple):
    """The function the stalls were seen in: the frame, how many stall samples showed it, of how many."""

    function: str
    file: str
    line: int
    seen: int
    samples: int

    @property
    def short(self) -> str:
        """'save_checkpoint (train.py:42)': the file's name only, for the title."""
        return f"{self.function} ({Path(self.file).name}{f':{self.line}' if self.line else ''})"

    @property
    def full(self) -> str:
        return f"{self.function} ({self.file}{f':{self.line}' if self.line else ''})"


def is_job_code(function: str, file: str) -> bool:
    if not file or _TORCH in file or file.startswith(_JOBWARDEN):
        return False
    return not is_library(Frame(function, file))


def own_frame(sample: StackSample) -> tuple[str, str, int] | None:
    """The innermost frame of the job's own code in a sample: (function, file, line)."""
    for i, (function, file) in enumerate(sample.frames):
        if is_job_code(function, file):
            return function, file, sample.line(i)
    return None


def of_stalls(samples: Sequence[StackSample], stalled: Sequence[tuple[StepMove, float]]) -> list[StackSample]:
    """The samples taken during the stalls found (one each at most: the shim dumps a stall once)."""
    began = {m.at for m, _ in stalled}
    return [s for s in samples if s.stall_at in began]


def stalling_frame(samples: Sequence[StackSample]) -> StallFrame | None:
    """The job's frame most stall samples show, when at least MIN_AGREE and more than half of them do;
    its most frequent line. None when they disagree or show none of the job's code."""
    seen: Counter[tuple[str, str]] = Counter()
    lines: dict[tuple[str, str], Counter[int]] = {}
    for s in samples:
        own = own_frame(s)
        if own is None:
            continue
        key = own[:2]
        seen[key] += 1
        lines.setdefault(key, Counter())[own[2]] += 1
    if not seen:
        return None
    (function, file), n = seen.most_common(1)[0]
    if n < MIN_AGREE or 2 * n <= len(samples):
        return None
    line = lines[(function, file)].most_common(1)[0][0]
    return StallFrame(function, file, line, n, len(samples))


class Stalled(NamedTuple):
    """Stalls found: the usual gap, each stall (the move it began after, its gap), the steps between two
    (mean, or median of short pauses), the share of the time they cost, the seconds of moves judged."""

    usual: float
    stalled: list[tuple[StepMove, float]]
    every: float
    share: float
    span: float


def long_stalls(moves: Sequence[StepMove]) -> Stalled | None:
    found = stalls(moves)
    if found is None:
        return None
    usual, stalled = found
    if len(stalled) < MIN_STALLS:
        return None
    every = [b.step - a.step for (a, _), (b, _) in pairwise(stalled)]
    mean = averages.fmean(every)
    if mean <= 0 or max(abs(e - mean) for e in every) > REGULAR * mean:
        return None
    span = moves[-1].at - moves[0].at
    share = sum(g - usual for _, g in stalled) / span if span > 0 else 0.0
    return Stalled(usual, stalled, mean, share, span) if share >= SHARE else None


def pauses(moves: Sequence[StepMove]) -> Stalled | None:
    """Short pauses over the last PAUSE_WINDOW_S of moves (the module's doc), or None."""
    recent = [m for m in moves if m.at >= moves[-1].at - PAUSE_WINDOW_S] if moves else []
    if len(recent) < MIN_MOVES:
        return None
    gaps = list(pairwise(recent))
    running = [(a, b) for a, b in gaps if not b.still]
    if len(running) < RUNNING_GAPS or averages.median(b.step - a.step for a, b in running) < PAUSE_STEPS:
        return None
    usual = averages.median(b.at - a.at for a, b in running)
    stalled = [(a, b.at - a.at) for a, b in gaps if b.still and b.at - a.at > usual]
    if len(stalled) < MIN_STALLS:
        return None
    every = sorted(b.step - a.step for (a, _), (b, _) in pairwise(stalled))
    # most pauses come every so many steps, or a multiple of it (a pause that fell between two looks is
    # not seen): pauses at random (a shared disk, the network) are no habit of the loop's
    typical = averages.median_low(every[: (len(every) + 1) // 2])
    if typical <= 0 or averages.median(abs(e / typical - round(e / typical)) for e in every) > PAUSE_SPREAD:
        return None
    span = recent[-1].at - recent[0].at
    share = sum(g - usual for _, g in stalled) / span if span > 0 else 0.0
    return Stalled(usual, stalled, typical, share, span) if share >= PAUSE_SHARE else None


def _seconds(s: float) -> str:
    return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"


def periodic_stall(ev: SpeedEvidence) -> Finding | None:
    found = long_stalls(ev.moves) or pauses(ev.moves)
    if found is None:
        return None
    usual, stalled, mean, share, span = found
    sampled = of_stalls(ev.stall_samples, stalled)
    frame = stalling_frame(sampled)
    # the shim dumps a stall once the counter stood still as long as a long one: short pauses never
    dumped = any(g >= stall_after(usual_gap(ev.moves) or usual) for _, g in stalled)
    waiting = ev.stall_sampling and len(sampled) < MIN_AGREE and len(stalled) < MIN_STALLS + HOLD_STALLS
    if frame is None and waiting and dumped:
        return None  # the next stalls' dumps may name the function: worth a stall or two more of waiting
    length = averages.median(g for _, g in stalled)
    stops = f"progress stops for {_seconds(length)} every {mean:.0f} steps"
    period_s = averages.fmean(b.at - a.at for (a, _), (b, _) in pairwise(stalled))
    steps = ", ".join(f"{m.step}" for m, _ in stalled[-5:])  # where the counter stood still
    where = f" in {frame.short}" if frame else ""
    evidence = [
        f"{len(stalled)} stalls in {span:.0f}s, at steps {steps}",
        f"usual time between moves {usual:.1f}s; the stalls lasted {_seconds(length)} (median)",
    ]
    if frame:
        evidence.append(
            f"the main thread was in {frame.full} in {frame.seen} of {frame.samples} py-spy dumps taken "
            "during the stalls"
        )
    elif sampled:
        evidence.append(
            f"{len(sampled)} py-spy dump{'s' if len(sampled) > 1 else ''} taken during the stalls name no "
            "function of the job's own code that most of them share"
        )
    return Finding(
        "periodic-stall",
        f"{stops}{where}: {100 * share:.0f}% of the time",
        f"Every {mean:.0f} steps (about every {_seconds(period_s)}) the step counter stands still for about "
        f"{_seconds(length)}{f', in {frame.full}' if frame else ''}, against {usual:.1f}s between moves "
        f"otherwise: {100 * share:.0f}% of the run's time goes to these pauses.",
        "warning" if share >= 0.25 else "info",
        tuple(evidence),
        (f"Look at what {frame.function} does at that step" if frame else "Find what runs at that step")
        + " (a checkpoint, an evaluation, a log or metrics flush): save checkpoints less often or in a "
        "background thread (torch.distributed.checkpoint.async_save), evaluate less often or on fewer "
        "batches, log asynchronously."
        + ("" if frame else " `jobwarden profile` during a stall names the function."),
        (ev.main_pid,) if ev.main_pid is not None else ev.pids[:1],
    )

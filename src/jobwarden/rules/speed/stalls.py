"""`periodic-stall`: progress stops at regular intervals (a checkpoint, an evaluation, a flush of the logs)
for a large share of the time. From the step counter's moves as the shim saw them: a gap far longer than
the usual one is a stall; stalls that come back every so many steps are periodic (research/slowness.md
2.12: heartbeat inter-arrival times turn bimodal).

Which function stalls: the shim dumps the loop process's main thread once during each stall (when the
counter has stood still for as long as a stall here, shim.stacksample), and the finding names the frame
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


def periodic_stall(ev: SpeedEvidence) -> Finding | None:
    found = stalls(ev.moves)
    if found is None:
        return None
    usual, stalled = found
    if len(stalled) < MIN_STALLS:
        return None
    every = [b.step - a.step for (a, _), (b, _) in pairwise(stalled)]
    mean = averages.fmean(every)
    if mean <= 0 or max(abs(e - mean) for e in every) > REGULAR * mean:
        return None
    span = ev.moves[-1].at - ev.moves[0].at
    lost = sum(g - usual for _, g in stalled)
    share = lost / span if span > 0 else 0.0
    if share < SHARE:
        return None
    sampled = of_stalls(ev.stall_samples, stalled)
    frame = stalling_frame(sampled)
    waiting = ev.stall_sampling and len(sampled) < MIN_AGREE and len(stalled) < MIN_STALLS + HOLD_STALLS
    if frame is None and waiting:
        return None  # the next stalls' dumps may name the function: worth a stall or two more of waiting
    length = averages.median(g for _, g in stalled)
    period_s = averages.fmean(b.at - a.at for (a, _), (b, _) in pairwise(stalled))
    steps = ", ".join(f"{m.step}" for m, _ in stalled[-5:])  # where the counter stood still
    where = f" in {frame.short}" if frame else ""
    evidence = [
        f"{len(stalled)} stalls in {span:.0f}s, at steps {steps}",
        f"usual time between moves {usual:.1f}s; the stalls lasted {length:.0f}s (median)",
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
        f"progress stops for {length:.0f}s every {mean:.0f} steps{where}: {100 * share:.0f}% of the time",
        f"Every {mean:.0f} steps (about every {period_s:.0f}s) the step counter stands still for about "
        f"{length:.0f}s{f', in {frame.full}' if frame else ''}, against {usual:.1f}s between moves "
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

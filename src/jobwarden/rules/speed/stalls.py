"""`periodic-stall`: progress stops at regular intervals (a checkpoint, an evaluation, a flush of the logs)
for a large share of the time. From the step counter's moves as the shim saw them: a gap far longer than
the usual one is a stall; stalls that come back every so many steps are periodic (research/slowness.md
2.12: heartbeat inter-arrival times turn bimodal). Which function stalls needs a profile taken during one
(`jobwarden profile`); the counter tells when, how long and what it costs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from itertools import pairwise

from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import SpeedEvidence, StepMove

STALL_TIMES = 4.0  # a gap this many times the usual one is a stall ...
STALL_MIN_S = 3.0  # ... and at least this long (the shim looks once a second)
MIN_STALLS = 3
REGULAR = 0.25  # the steps between stalls vary by at most this share of their mean
SHARE = 0.10  # the stalls cost at least this share of the time


def stalls(moves: Sequence[StepMove]) -> tuple[float, list[tuple[StepMove, float]]] | None:
    """(the usual gap, [(the move a stall began after, its length)]) or None with too few moves."""
    if len(moves) < 10:
        return None
    gaps = [(a, b.at - a.at) for a, b in pairwise(moves)]
    usual = statistics.median(g for _, g in gaps)
    if usual <= 0:
        return None
    return usual, [(m, g) for m, g in gaps if g >= max(STALL_TIMES * usual, STALL_MIN_S)]


def periodic_stall(ev: SpeedEvidence) -> Finding | None:
    found = stalls(ev.moves)
    if found is None:
        return None
    usual, stalled = found
    if len(stalled) < MIN_STALLS:
        return None
    every = [b.step - a.step for (a, _), (b, _) in pairwise(stalled)]
    mean = statistics.fmean(every)
    if mean <= 0 or max(abs(e - mean) for e in every) > REGULAR * mean:
        return None
    span = ev.moves[-1].at - ev.moves[0].at
    lost = sum(g - usual for _, g in stalled)
    share = lost / span if span > 0 else 0.0
    if share < SHARE:
        return None
    length = statistics.median(g for _, g in stalled)
    period_s = statistics.fmean(b.at - a.at for (a, _), (b, _) in pairwise(stalled))
    steps = ", ".join(f"{m.step}" for m, _ in stalled[-5:])  # where the counter stood still
    return Finding(
        "periodic-stall",
        f"progress stops for {length:.0f}s every {mean:.0f} steps: {100 * share:.0f}% of the time",
        f"Every {mean:.0f} steps (about every {period_s:.0f}s) the step counter stands still for about "
        f"{length:.0f}s, against {usual:.1f}s between moves otherwise: {100 * share:.0f}% of the run's time "
        "goes to these pauses.",
        "warning" if share >= 0.25 else "info",
        (
            f"{len(stalled)} stalls in {span:.0f}s, at steps {steps}",
            f"usual time between moves {usual:.1f}s; the stalls lasted {length:.0f}s (median)",
        ),
        "Find what runs at that step (a checkpoint, an evaluation, a log or metrics flush): save "
        "checkpoints less often or in a background thread (torch.distributed.checkpoint.async_save), "
        "evaluate less often or on fewer batches, log asynchronously. `jobwarden profile` during a stall "
        "names the function.",
        (ev.main_pid,) if ev.main_pid is not None else ev.pids[:1],
    )

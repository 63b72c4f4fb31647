"""`slowed-down`: the step rate fell well below the run's own earlier rate, for longer than a blip.

The earlier rate is the best the run sustained: the highest median of three consecutive stretches before
the slowdown (a warm-up or a single slow stretch never sets it, a one-off fast stretch neither). The
slowdown is the newest run of stretches each below SLOW_RATIO of that rate, lasting at least BLIP_S: a
checkpoint or an evaluation pause is one slow stretch, not a slowdown. Marin's stall alert (research 4:
"step time doubling") and the 2-of-3-over-a-median rule of browserarena#65 are the models; the rate is
jobwarden's own clock, never the bar's smoothed one.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobwarden.clock import shown_time
from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import Segment, SpeedEvidence

SLOW_RATIO = 0.6  # a stretch at less than this share of the earlier rate is slow (1.67x slower)
BLIP_S = 15.0
MIN_BEFORE = 3  # stretches of an earlier rate needed before anything is slow against it


def _median3(a: float, b: float, c: float) -> float:
    return sorted((a, b, c))[1]


def earlier_rates(segments: Sequence[Segment]) -> list[float | None]:
    """For each stretch, the best rate sustained by the stretches before it (None: too few yet)."""
    best: float | None = None
    out: list[float | None] = []
    for i in range(len(segments)):
        out.append(best)
        if i >= 2:
            m = _median3(segments[i - 2].rate, segments[i - 1].rate, segments[i].rate)
            best = m if best is None else max(best, m)
    return out


def slowdown(segments: Sequence[Segment]) -> tuple[float, Segment, float, float] | None:
    """(earlier rate, first slow stretch, rate since, seconds since) of the current slowdown, or None."""
    earlier = earlier_rates(segments)
    k = len(segments)
    while k > 0:
        base = earlier[k - 1]
        if base is None or base <= 0 or segments[k - 1].rate > SLOW_RATIO * base:
            break
        k -= 1
    slow = segments[k:]
    if not slow or k < MIN_BEFORE:
        return None
    base = earlier[k]
    seconds = sum(s.seconds for s in slow)
    if base is None or seconds < BLIP_S or len(slow) < 2:
        return None
    rate = sum(s.rate * s.seconds for s in slow) / seconds
    return base, slow[0], rate, seconds


def slowing(segments: Sequence[Segment]) -> bool:
    """The newest stretch ran below SLOW_RATIO of the earlier rate: maybe a slowdown begins (one stretch is
    no slowdown yet, but worth a closer look)."""
    if not segments:
        return False
    base = earlier_rates(segments)[-1]
    return base is not None and base > 0 and segments[-1].rate <= SLOW_RATIO * base


def _rate(rate: float, unit: str) -> str:
    return f"{rate:.3g} {unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{unit}"


def slowed_down(ev: SpeedEvidence) -> Finding | None:
    found = slowdown(ev.segments)
    if found is None:
        return None
    base, first, rate, seconds = found
    if rate <= 0:  # standing still is no slowdown: the progress watch's `stalled` and the hang rules say it
        return None
    clock = shown_time(first.at, "minute")
    times = f"{base / rate:.1f}×"
    lost = 1 - rate / base
    return Finding(
        "slowed-down",
        f"slowed down {times} since step {first.step} ({clock})",
        f"The job ran at {_rate(base, ev.unit)} earlier in this run and has run at {_rate(rate, ev.unit)} "
        f"for {seconds:.0f}s, since step {first.step}: it loses {100 * lost:.0f}% of its throughput.",
        "warning" if lost >= 0.4 else "info",
        (
            f"earlier rate {_rate(base, ev.unit)} (the best sustained over three stretches before step "
            f"{first.step})",
            f"since step {first.step} at {clock}: {_rate(rate, ev.unit)} over {seconds:.0f}s",
            "rates measured on jobwarden's clock from the step counter, not the bar's printed rate",
        ),
        "See what changed at that moment: the other speed findings of this job (CPU, I/O, GPU), a "
        "neighbour that started, a phase of the job (longer sequences, evaluation inside the loop); "
        "`jobwarden profile` shows where the time goes now.",
        (ev.main_pid,) if ev.main_pid is not None else ev.pids[:1],
    )

"""The step rate on jobwarden's own clock, and how long the counter has stood still.

A bar's printed rate is the bar's opinion: tqdm smooths it (EMA, smoothing=0.3) and it stays as last
printed while the loop is stuck; Lightning averages over the whole epoch. Here the rate is what the
counter did over the last WINDOW_S seconds of observations: (step now - step then) / (now - then), "then"
being the newest change at least WINDOW_S old (or the oldest one known). A counter that stops sees its
rate fall as time passes; a slow one (a step every ten minutes) is still measured over its last change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

WINDOW_S = 30.0


class StepClock:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.identity: Hashable = None
        self.changes: deque[tuple[float, int]] = deque()  # (time first seen, step), oldest first
        self.count = 0  # changes seen for this identity: a counter seen moving twice is a live one
        self.gaps: deque[float] = deque(maxlen=8)  # seconds between the last changes

    def observe(self, at: float, step: int | None, identity: Hashable = None) -> bool:
        """A reading of the counter at `at` (seconds, any clock that does not jump); True when it moved.
        A new identity (another bar), or a step that went back (a bar reset for a new epoch), starts
        the measure over."""
        if step is None:
            return False
        last = self.changes[-1][1] if self.changes else None
        if identity != self.identity or (last is not None and step < last):
            self.identity = identity
            self.changes.clear()
            self.gaps.clear()
            self.count = 0
            last = None
        if step == last:
            return False
        if self.changes:
            self.gaps.append(max(at - self.changes[-1][0], 0.0))
        self.changes.append((at, step))
        self.count += 1
        while len(self.changes) > 2 and self.changes[1][0] <= at - self.window_s:
            self.changes.popleft()  # keep one change older than the window: the base of the rate
        return last is not None

    def rate(self, now: float) -> float | None:
        """Steps per second over the window ending `now`; None before the counter has moved."""
        if len(self.changes) < 2:
            return None
        base_at, base = self._base(now)
        step = self.changes[-1][1]
        elapsed = now - base_at
        if elapsed <= 0 or step <= base:
            return None
        return (step - base) / elapsed

    def _base(self, now: float) -> tuple[float, int]:
        """The newest change at least a window old, but never the last one (a counter standing still
        for longer than the window is measured from the change before: its rate falls as time passes)."""
        older = [i for i, change in enumerate(self.changes) if change[0] <= now - self.window_s]
        at = min(older[-1], len(self.changes) - 2) if older else 0
        return self.changes[at]

    def still_for(self, now: float) -> float | None:
        """Seconds since the counter last moved (None before it was seen)."""
        return now - self.changes[-1][0] if self.changes else None

    def interval(self) -> float | None:
        """The typical time between two changes (the mean of the last few); None before two of them."""
        if len(self.gaps) < 2:
            return None
        return sum(self.gaps) / len(self.gaps)

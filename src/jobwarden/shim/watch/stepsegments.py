"""The step counter as the speed watch sees it at each of the shim's looks: cut into stretches of a rate
(slowed-down, rules.speed.steps) and kept as its recent moves, each with the looks that found it still
since the move before (periodic-stall, rules.speed.stalls)."""

from __future__ import annotations

from collections import deque

from jobwarden.rules.speed.evidence import Segment, StepMove

SEGMENT_S = 5.0  # a stretch of the step counter lasts at least this ...
SEGMENT_STEPS = 5  # ... and holds this many steps, or lasts SEGMENT_MAX_S
SEGMENT_MAX_S = 60.0
SEGMENTS_KEPT = 720  # an hour at 5 s: the run's earlier rate
MOVES_KEPT = 600  # ten minutes of moves seen once a second


class Segments:
    """The step counter cut into stretches of at least SEGMENT_S and SEGMENT_STEPS steps, and its last
    MOVES_KEPT moves (periodic stalls)."""

    def __init__(self) -> None:
        self.done: deque[Segment] = deque(maxlen=SEGMENTS_KEPT)
        self.moves: deque[StepMove] = deque(maxlen=MOVES_KEPT)
        self._start: tuple[float, float, int] | None = None  # mono, wall, step
        self._still = 0  # looks since the last move that found the counter where it was

    def observe(self, mono: float, wall: float, step: int | None) -> None:
        """One look of the shim (each tick) at the counter (None: no counter)."""
        if step is None:
            return
        if not self.moves or self.moves[-1].step != step:
            if self.moves and step < self.moves[-1].step:
                self.moves.clear()  # a new bar: its steps are not the old one's
            self.moves.append(StepMove(mono, step, self._still if self.moves else 0))
            self._still = 0
        else:
            self._still += 1
        start = self._start
        if start is None or step < start[2]:  # a new bar, or one reset for a new epoch
            self._start = (mono, wall, step)
            return
        seconds, steps = mono - start[0], step - start[2]
        if seconds >= SEGMENT_S and (steps >= SEGMENT_STEPS or seconds >= SEGMENT_MAX_S):
            self.done.append(Segment(at=start[1], step=start[2], rate=steps / seconds, seconds=seconds))
            self._start = (mono, wall, step)

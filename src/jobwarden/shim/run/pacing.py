"""The supervising loop's pace: while nothing changes it should cost almost nothing (issue 25).

Measured on a 2-core machine shared with test runs: 20 idle `sleep` jobs cost 0.84-0.88 % of a core each,
nearly all of it the host's process events (74 a second) parsed by every supervisor, and a 1 s tick.
"""

from __future__ import annotations

from jobwarden import config

# While nothing moves (no CPU, output, heartbeat, I/O, GPU use, birth or death), the tick doubles from
# config.TICK_S up to this: an idle supervisor then costs an eighth. Deaths still wake the loop at once
# (pidfds), a hang is judged when its window ends (the tracker's due time), and the first tick that sees
# movement brings the pace back to TICK_S.
IDLE_TICK_MAX_S = 8.0
STEADY_PACE_S = 10.0  # the first seconds of a watch keep TICK_S: a short job makes all its moves then
# after a move, TICK_S still for this long: a job that steps, then holds (a checkpoint, a held test job, a
# step written just before a read), has its sample and progress recorded at the usual second's pace, and
# only a job idle this long slows its supervisor down (a sleep job, a server between requests)
QUIET_BEFORE_SLOWING_S = 20.0
# The kernel's process events are the whole host's: on a busy machine they woke every supervisor a
# hundred times a second for nothing. After a wake that brought none of the job's, the connector is left
# out of the wait this long (its events queue, and every wake drains them); any of the job's keeps it
# listening at once for KERNEL_HOT_S. Deaths of members never wait on it: their pidfds are in every wait.
KERNEL_MUTE_S = 0.25
KERNEL_HOT_S = 2.0


class Pace:
    """When the loop looks next: every TICK_S while the job moves (and in its first STEADY_PACE_S), the
    interval doubling up to a cap while nothing does; never later than a hang's due moment."""

    def __init__(self, now: float) -> None:
        self.next_tick = now
        self.next_full = now + config.FULL_SCAN_EVERY_S
        self.every = config.TICK_S
        self.steady_until = now + STEADY_PACE_S

    def after_tick(self, now: float, moved: bool, cap: float, due: float | None, full: bool) -> None:
        if moved:
            self.steady_until = max(self.steady_until, now + QUIET_BEFORE_SLOWING_S)
        steady = moved or now < self.steady_until
        self.every = config.TICK_S if steady else min(self.every * 2, cap)
        self.next_tick = now + self.every
        if due is not None:
            self.next_tick = min(self.next_tick, max(due, now + 0.1))
        if full:
            self.next_full = now + config.FULL_SCAN_EVERY_S


def idle_cap(hang_window_s: float | None) -> float:
    """The slowest idle tick: IDLE_TICK_MAX_S, and at least three looks per hang window (quiet I/O is
    progress only from its second reading: a 2 s window once judged a job reading a file hung)."""
    if not hang_window_s:
        return IDLE_TICK_MAX_S
    return min(IDLE_TICK_MAX_S, max(config.TICK_S, hang_window_s / 3))


class KernelPace:
    """When the host's process events may wake the loop: after a wake that brought none of the job's,
    not for KERNEL_MUTE_S (they queue; every wake drains them); for KERNEL_HOT_S after one of the job's,
    always."""

    def __init__(self) -> None:
        self._muted_until = 0.0
        self._hot_until = 0.0

    def muted_until(self, now: float) -> float | None:
        return self._muted_until if now < self._muted_until else None

    def after_wake(self, now: float, news: bool, woke_by_events: bool) -> None:
        if news:
            self._hot_until = now + KERNEL_HOT_S
        elif woke_by_events and now >= self._hot_until:
            self._muted_until = now + KERNEL_MUTE_S

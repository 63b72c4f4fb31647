"""The loop's pace (shim.run.pacing): slower while nothing moves, back at once when something does."""

from __future__ import annotations

from jobwarden.shim.run.pacing import (
    IDLE_TICK_MAX_S,
    KERNEL_MUTE_S,
    QUIET_BEFORE_SLOWING_S,
    STEADY_PACE_S,
    KernelPace,
    Pace,
    idle_cap,
)


def ticks(
    pace: Pace, moved: list[bool], cap: float = IDLE_TICK_MAX_S, due: float | None = None
) -> list[float]:
    seen = []
    for m in moved:
        now = pace.next_tick
        pace.after_tick(now, m, IDLE_TICK_MAX_S, due, full=False)
        seen.append(round(pace.every, 3))
    return seen


def test_an_idle_tick_doubles_up_to_its_cap_and_movement_brings_it_back() -> None:
    pace = Pace(0.0)
    pace.steady_until = 0.0  # past the start
    assert ticks(pace, [False] * 5 + [True, False]) == [2.0, 4.0, 8.0, 8.0, 8.0, 1.0, 1.0]
    # after a move, a second's pace for QUIET_BEFORE_SLOWING_S, then the doubling again
    quiet = ticks(pace, [False] * int(QUIET_BEFORE_SLOWING_S + 4))
    assert quiet[: int(QUIET_BEFORE_SLOWING_S) - 2] == [1.0] * (int(QUIET_BEFORE_SLOWING_S) - 2)
    slowing = quiet[quiet.index(2.0) :]
    assert slowing[:3] == [2.0, 4.0, 8.0] and set(quiet) == {1.0, 2.0, 4.0, 8.0}


def test_the_first_seconds_keep_one_tick_a_second() -> None:
    pace = Pace(0.0)
    assert set(ticks(pace, [False] * int(STEADY_PACE_S))) == {1.0}


def test_a_hang_due_before_the_next_tick_is_looked_at_then() -> None:
    pace = Pace(0.0)
    pace.steady_until = 0.0
    ticks(pace, [False] * 4, due=None)
    now = pace.next_tick
    pace.after_tick(now, False, IDLE_TICK_MAX_S, now + 3.0, full=False)
    assert pace.next_tick == now + 3.0


def test_a_short_hang_window_is_looked_at_three_times() -> None:
    assert idle_cap(None) == IDLE_TICK_MAX_S
    assert idle_cap(600.0) == IDLE_TICK_MAX_S
    assert idle_cap(9.0) == 3.0
    assert idle_cap(2.0) == 1.0  # never under the tick


def test_the_host_events_are_muted_after_a_wake_for_nothing_and_not_while_the_jobs_come() -> None:
    kernel = KernelPace()
    kernel.after_wake(10.0, news=False, woke_by_events=True)
    assert kernel.muted_until(10.1) == 10.0 + KERNEL_MUTE_S
    assert kernel.muted_until(10.0 + KERNEL_MUTE_S) is None
    kernel.after_wake(20.0, news=True, woke_by_events=True)
    kernel.after_wake(20.5, news=False, woke_by_events=True)  # hot: the job's came lately
    assert kernel.muted_until(20.6) is None

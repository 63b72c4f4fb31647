"""Time. Durations use a monotonic clock that tests can replace; wall time is for storage and display."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_700_000_000.0) -> None:
        self._mono = start
        self._wall = wall_start

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._wall += seconds


def iso(ts: float | None) -> str | None:
    """Wall time as ISO 8601 in UTC, the format of every timestamp jobwarden prints in JSON."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"

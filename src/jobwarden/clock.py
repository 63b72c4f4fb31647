"""Time. Durations use a monotonic clock that tests can replace; wall time is for storage and display."""

from __future__ import annotations

import time
from collections.abc import Callable
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


# Times read back from the store are data: a row written by another version, a broken clock or a hand
# may hold 1e300, -1e300 or NaN, which gmtime/localtime refuse (OverflowError, OSError, ValueError). A time
# outside years 1 to 9999 is shown as unknown rather than failing the whole command.
_EARLIEST, _LATEST = -62_135_596_800.0, 253_402_300_799.0  # 0001-01-01 and 9999-12-31 23:59:59 UTC


def plausible(ts: float | None) -> bool:
    """Whether `ts` is a wall time that can be shown (a finite number within years 1-9999)."""
    return isinstance(ts, int | float) and _EARLIEST <= ts <= _LATEST


def iso(ts: float | None) -> str | None:
    """Wall time as ISO 8601 in UTC, the format of every timestamp jobwarden prints in JSON; None where
    the time is unknown or absurd."""
    if ts is None or not plausible(ts):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


# --- time as a user reads it: one zone and one format for every command ---------------------------------
#
# Local time with its UTC offset by default, 24-hour; UTC everywhere with `jobwarden --utc` (or
# JOBWARDEN_UTC=1 in the environment, which the shim inherits, so the times it writes into findings agree).
# JSON keeps ISO 8601 in UTC (`iso`): it is read by programs, not people.

UTC_ENV = "JOBWARDEN_UTC"
_utc: bool | None = None  # None: not decided yet (read from the environment on first use)
# asked when neither --utc nor JOBWARDEN_UTC decided: the CLI sets it to read the config file's
# `[display] utc`, only once a time is shown (the file costs the commands that show none nothing)
default_utc: Callable[[], bool] | None = None


def show_utc(on: bool) -> None:
    """Every time shown from now on in UTC (`--utc`)."""
    global _utc
    _utc = on


def showing_utc() -> bool:
    global _utc
    if _utc is None:
        import os

        said = os.environ.get(UTC_ENV, "").strip().lower()
        # the environment first (JOBWARDEN_UTC=0 overrides the config file), then the config file
        _utc = said in ("1", "true", "yes", "on") if said else bool(default_utc and default_utc())
    return _utc


def _parts(ts: float) -> tuple[time.struct_time, str]:
    """The time's fields in the zone shown, and that zone's offset ("+01:00", "Z" for UTC)."""
    if showing_utc():
        return time.gmtime(ts), "Z"
    local = time.localtime(ts)
    offset = local.tm_gmtoff or 0
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset) // 60, 60)
    return local, f"{sign}{hours:02d}:{minutes:02d}"


SHORT_SPAN_S = 600  # a span shorter than this is shown to the second: '06:33:23–06:33:38', not '06:33–06:33'


def shown_span(since: float | None, until: float | None) -> str:
    """'14:02–14:19' (shown_time's zone); to the second when the span is short or within one minute."""
    if since is None or until is None:
        return f"until {shown_time(until, 'time')}" if until is not None else ""
    short = until - since < SHORT_SPAN_S or shown_time(since, "minute") == shown_time(until, "minute")
    style = "time" if short else "minute"
    return f"{shown_time(since, style)}–{shown_time(until, style)}"


def shown_time(ts: float | None, style: str = "full") -> str:
    """`ts` as every command shows it. Styles: `full` '2026-11-25 14:02:11 +01:00' (a start, an end);
    `time` '14:02:11' and `minute` '14:02' (a moment within a report whose full times are shown,
    with a 'Z' in UTC so that a short time is never read in the wrong zone); `ms` '14:02:11.250' (the
    order of ranks' ends). None: '-'; an absurd time (see `plausible`): '?'."""
    if ts is None:
        return "-"
    if not plausible(ts):
        return "?"
    try:
        fields, zone = _parts(ts)
    except (OverflowError, OSError, ValueError):  # a platform's localtime may have narrower bounds
        return "?"
    if style == "full":
        return time.strftime("%Y-%m-%d %H:%M:%S", fields) + (" UTC" if zone == "Z" else f" {zone}")
    suffix = "Z" if zone == "Z" else ""
    if style == "minute":
        return time.strftime("%H:%M", fields) + suffix
    if style == "ms":
        return time.strftime("%H:%M:%S", fields) + f".{int(ts * 1000) % 1000:03d}{suffix}"
    return time.strftime("%H:%M:%S", fields) + suffix

"""One time zone for every command (clock.shown_time): local with its offset, or UTC with --utc; and the
hung look of `ps` kept in step with the rules whose finding lasts as long as a hang."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from jobwarden import clock
from jobwarden.model import HUNG_RULES
from jobwarden.rules.table import ENDS_WITH_THE_HANG

AT = 1_764_000_000.25  # 2025-11-24 16:00:00.250 UTC


@pytest.fixture
def zone() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/St_Johns"  # -03:30 in November: a half-hour offset west of UTC
    time.tzset()
    clock.show_utc(False)
    yield
    clock.show_utc(False)
    if old is None:
        os.environ.pop("TZ")
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_local_time_carries_its_offset_and_is_24_hour(zone: None) -> None:
    assert clock.shown_time(AT) == "2025-11-24 12:30:00 -03:30"
    assert clock.shown_time(AT, "time") == "12:30:00"
    assert clock.shown_time(AT, "minute") == "12:30"
    assert clock.shown_time(AT, "ms") == "12:30:00.250"
    assert clock.shown_time(AT + 6 * 3600) == "2025-11-24 18:30:00 -03:30"  # never 6:30 PM
    assert clock.shown_time(None) == "-"


def test_utc_everywhere_when_asked(zone: None) -> None:
    clock.show_utc(True)
    assert clock.shown_time(AT) == "2025-11-24 16:00:00 UTC"
    assert clock.shown_time(AT, "time") == "16:00:00Z"  # a short time says its zone too
    assert clock.shown_time(AT, "minute") == "16:00Z"
    assert clock.shown_time(AT, "ms") == "16:00:00.250Z"


def test_the_hung_look_follows_the_rules_that_last_as_long_as_the_hang() -> None:
    assert HUNG_RULES == ENDS_WITH_THE_HANG


@pytest.mark.parametrize("absurd", [1e300, -1e300, 1e18, float("inf"), float("nan")])
def test_an_absurd_stored_time_is_shown_as_unknown_never_raised(absurd: float) -> None:
    """A sample or run stored at 1e300 made `metrics` fail with OverflowError from gmtime: a time outside
    years 1-9999 is shown as '?' and serialised as null."""
    from jobwarden.model import _iso

    assert not clock.plausible(absurd)
    assert clock.iso(absurd) is None and _iso(absurd) is None
    for style in ("full", "time", "minute", "ms"):
        assert clock.shown_time(absurd, style) == "?"
    assert clock.shown_span(AT, absurd).count("?") == 1


def test_times_at_the_edges_of_the_years_shown_still_read() -> None:
    assert clock.iso(0.0) == "1970-01-01T00:00:00.000Z"
    assert clock.iso(253_402_300_799.0) == "9999-12-31T23:59:59.000Z"

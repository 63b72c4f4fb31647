"""The parsers for the units users type (durations, sizes) and their formatters."""

from __future__ import annotations

import pytest

from jobwarden.config import format_duration, format_size, parse_duration, parse_size
from jobwarden.errors import UsageError

# --- parse_duration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("1.5s", 1.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("2d", 172800.0),
        ("1d12h", 129600.0),
        ("250ms", 0.25),
        ("1m500ms", 60.5),
        ("5M", 300.0),  # case-insensitive: M is minutes here, not mega
        (" 10m ", 600.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "5x",
        "m",
        "1h 30m",  # parts must be written together
        "1h30",  # a bare number after a unit
        "h1",
        "1.s",
        "-5",
        "-5m",
        "0",
        "0s",
        "0m0s",
        "inf",
        "-inf",
        "infinity",
        "nan",
        "1e400",  # overflows to inf
    ],
)
def test_parse_duration_rejects_with_a_remedy(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_duration(text)
    assert repr(text) in info.value.message
    assert info.value.remedy
    assert info.value.exit_code == 2


def test_parse_duration_error_is_not_chained_to_the_float_error() -> None:
    # The user sees our message, not "could not convert string to float".
    with pytest.raises(UsageError) as info:
        parse_duration("soon")
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


# --- parse_size -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1000000", 1_000_000),
        ("1", 1),
        ("512b", 512),
        ("1k", 1024),
        ("1K", 1024),
        ("512M", 512 << 20),
        ("512MB", 512 << 20),
        ("512MiB", 512 << 20),
        ("4G", 4 << 30),
        ("4gb", 4 << 30),
        ("1.5GiB", 3 << 29),
        ("2T", 2 << 40),
        ("8 G", 8 << 30),
        (" 64k ", 64 << 10),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    ["", "G", "abc", "5x", "5 PB", "-1", "-1G", "0", "0G", "0.1", "1.5.5G", "4 G B"],
)
def test_parse_size_rejects_with_a_remedy(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert repr(text) in info.value.message
    assert info.value.remedy
    assert info.value.exit_code == 2


# --- formatters -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.9, "0s"),
        (59, "59s"),
        (59.99, "59s"),
        (60, "1m00s"),
        (90, "1m30s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (5400, "1h30m"),
        (86399, "23h59m"),
        (86400, "1d0h"),
        (90000, "1d1h"),
        (30 * 86400, "30d0h"),
        (-5, "0s"),  # clock skew between machines never prints a negative age
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0B"),
        (1, "1B"),
        (1023, "1023B"),
        (1024, "1.0K"),
        (1536, "1.5K"),
        (1 << 20, "1.0M"),
        (512 << 20, "512.0M"),
        (1 << 30, "1.0G"),
        (1 << 40, "1.0T"),
        (5 << 40, "5.0T"),
        (2048 << 40, "2048.0T"),
    ],
)
def test_format_size(n: int | None, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize("n", [(1 << 20) - 1, (1 << 30) - 1])
def test_format_size_never_prints_1024_of_a_unit(n: int) -> None:
    assert not format_size(n).startswith("1024.0")


def test_sizes_round_trip_through_format_and_parse() -> None:
    for n in (1 << 10, 3 << 20, 7 << 30, 2 << 40):
        assert parse_size(format_size(n)) == n

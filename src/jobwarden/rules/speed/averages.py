"""The medians and means the speed rules take: `statistics`' own, without importing `statistics`.

The supervisor of every job loads the speed rules. `statistics` brings `fractions`, `decimal` and `random`
with it: 1.5 MiB of private memory and 11 ms in each supervisor (measured in issue 25's
scripts/bench-invisible), for three functions of a few lines on plain floats.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

Number = TypeVar("Number", int, float)


def median(values: Iterable[float]) -> float:
    """The middle value, or the mean of the two middle ones (statistics.median); ValueError when empty."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("no median for empty data")
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def median_low(values: Iterable[Number]) -> Number:
    """The lower of the two middle values when their number is even (statistics.median_low)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no median for empty data")
    return ordered[(len(ordered) - 1) // 2]


def fmean(values: Iterable[float]) -> float:
    """The arithmetic mean as a float (statistics.fmean); ValueError when empty."""
    total, n = 0.0, 0
    for value in values:
        total += value
        n += 1
    if not n:
        raise ValueError("fmean requires at least one data point")
    return total / n

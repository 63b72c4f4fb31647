"""What `-v` and `-vv` print: the CLI's steps (-v) and their details (-vv), one line each on stderr.

Not the logging module: importing it costs every command milliseconds, and `run` is on a latency budget.
Off by default; cli.main turns it on from the count of -v.
"""

from __future__ import annotations

import sys
import time

_level = 0
_start = time.monotonic()


def set_level(level: int) -> None:
    global _level
    _level = level


def info(message: str) -> None:
    """A step of the command (-v): what it opened, started, signalled, waited for."""
    if _level >= 1:
        _say(message)


def debug(message: str) -> None:
    """A detail of a step (-vv)."""
    if _level >= 2:
        _say(message)


def enabled(level: int) -> bool:
    return _level >= level


def _say(message: str) -> None:
    elapsed_ms = (time.monotonic() - _start) * 1000
    print(f"jobwarden: [{elapsed_ms:7.1f} ms] {message}", file=sys.stderr, flush=True)

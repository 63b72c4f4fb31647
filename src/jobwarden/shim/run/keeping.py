"""--keep-running's patterns matched against command lines with a bound on each match.

A pattern such as `(a+)+$` backtracks exponentially on a command line of 34 a's and a `!`: `re` then ran
for ever inside the shim's end, so the run's end was never recorded and `stop` hung (issue 25). `re`
cannot be interrupted by a thread (it holds the GIL), but its matcher checks for signals every few
thousand steps (CPython Modules/_sre/sre_lib.h, `sigcount`), and a Python signal handler that raises
ends the match there. The timer is ITIMER_PROF (the shim's own CPU time, SIGPROF): SIGALRM is relayed to
the job by an attached shim (shim.run.enginestop), and a throttled quota slows a CPU budget by its share only.
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

MATCH_CPU_S = 0.1  # one search's CPU budget: a sane pattern takes microseconds on a command line


class TooSlow(Exception):
    """A search that ran out of its CPU budget."""


class Chosen(NamedTuple):
    pids: set[int]  # the processes whose command line matches a pattern
    too_slow: list[str]  # the patterns dropped when one of their searches ran out of time


def choose(patterns: Iterable[str], cmdlines: dict[int, str], cpu_s: float = MATCH_CPU_S) -> Chosen:
    """The pids whose command line one of `patterns` finds (re.search, as `pgrep -f`). A pattern whose
    search outruns `cpu_s` keeps nothing and is searched no more: the end waits at most `cpu_s` of CPU
    for each pattern beyond the fast searches."""
    chosen: set[int] = set()
    too_slow: list[str] = []
    for text in patterns:
        pattern = re.compile(text)
        try:
            chosen |= {pid for pid, cmdline in cmdlines.items() if search_bounded(pattern, cmdline, cpu_s)}
        except TooSlow:
            too_slow.append(text)
    return Chosen(chosen, too_slow)


def search_bounded(pattern: re.Pattern[str], text: str, cpu_s: float) -> bool:
    """pattern.search(text), raising TooSlow once it has used `cpu_s` of CPU. Main thread only (where
    Python runs signal handlers); elsewhere the search runs unbounded."""
    with _cpu_deadline(cpu_s):
        return pattern.search(text) is not None


def _raise_too_slow(signum: int, frame: Any) -> None:
    raise TooSlow


@contextlib.contextmanager
def _cpu_deadline(cpu_s: float) -> Iterator[None]:
    try:
        previous = signal.signal(signal.SIGPROF, _raise_too_slow)
    except ValueError:  # not the main thread: no handler can run here
        yield
        return
    try:
        signal.setitimer(signal.ITIMER_PROF, cpu_s)
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)  # disarmed before the handler goes: no stray SIGPROF
        signal.signal(signal.SIGPROF, previous)

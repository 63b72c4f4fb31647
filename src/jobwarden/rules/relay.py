"""Exceptions about other processes, read from what they say, with no list of launchers or classes:

- a *relayed* traceback: another process's exception inside this one's message, or in one it was raised
  from. A worker that catches its task's exception sends the formatted traceback to its parent, which
  re-raises it (concurrent.futures' and multiprocessing.pool's `_RemoteTraceback`, loky's, torch's
  DataLoader "Caught X in DataLoader worker process N. Original Traceback", torch.multiprocessing.spawn's
  "-- Process N terminated with the following error", Ray's RayTaskError): the exception belongs to the
  process that raised it, at its own raise site;
- a *report*: an exception whose text, or the frame that raised it, speaks of a process, worker, rank,
  pid or exit code (BrokenProcessPool, ChildFailedError, ProcessExitedException, CalledProcessError,
  WorkerCrashedError...): after another process failed, it reports that failure;
- a *reaction*: a peer's communication error (closed or reset by peer, broken pipe, EOF) after another
  member failed.

Pure: text in, facts out; rules.causal decides what they weigh.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from jobwarden.observations import UncaughtException
from jobwarden.rules import mltext
from jobwarden.rules.frames import is_library

__all__ = [
    "Relayed",
    "attribute",
    "named_ends",
    "peer_error",
    "relayed_in",
    "relayed_in_lines",
    "reports_on",
    "same_exception",
    "short_type",
    "top_level_traceback",
    "traceback_starts",
]

_START = re.compile(r"^\s*(?:Original )?Traceback \(most recent call last\):\s*$")
_QUOTES = re.compile(r'^\s*"""\s*$')
_NAMED_PID = re.compile(r"\bpid[=: ]\s*(\d+)")
# the index a relaying text gives the process: torch.multiprocessing.spawn's "Process 1" (its rank, as DDP
# code uses it) or a "rank 3"; a DataLoader's "worker process 0" is a worker id, not a rank
_NAMED_RANK = re.compile(r"(?i)(?<!worker )\b(?:process|rank)\s+(\d+)\b")
# "process 1 terminated with exit code 3", "rank 2 ... exitcode: -9": a report of one process's end
_NAMED_END = re.compile(
    r"(?i)\b(?:process|rank)\s+(\d+)\b[^\n]{0,80}?\b(?:exit ?code|exit status)\b[:\s]+(-?\d+)"
)


class Relayed(NamedTuple):
    """Another process's traceback inside an exception: what it was, and what the relaying text says of
    the process that raised it (`intro`: "Caught ValueError in DataLoader worker process 0.")."""

    traceback: mltext.PyTraceback
    intro: str
    pid: int | None  # a pid the text names ("pid=4242")
    rank: int | None  # "Process 1", "rank 3"


def relayed_in(messages: Iterable[str]) -> list[Relayed]:
    """The tracebacks embedded in exception messages (each message whole, newlines kept)."""
    found: list[Relayed] = []
    for message in messages:
        found += _embedded(message.splitlines())
    return found


def _embedded(lines: Sequence[str]) -> list[Relayed]:
    starts = [i for i, line in enumerate(lines) if _START.match(line)]
    found = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        block = [line for line in lines[start + 1 : end] if not _QUOTES.match(line)]
        parsed = mltext.parse_traceback(["Traceback (most recent call last):", *block])
        if parsed is None:
            continue
        before = [line.strip() for line in lines[:start] if line.strip() and not _QUOTES.match(line)]
        intro = before[-1] if before else ""
        found.append(Relayed(parsed, intro, _first_int(_NAMED_PID, intro), _first_int(_NAMED_RANK, intro)))
    return found


def relayed_in_lines(lines: Sequence[str]) -> list[Relayed]:
    """Relayed tracebacks in printed output, for a process whose exception the hooks did not record: a
    block that follows a line of three double quotes (the remote-traceback convention), "Original
    Traceback", or a line that announces an error ("...terminated with the following error:"). A
    top-level traceback follows anything else, so these markers are needed here, where messages are not
    told apart from output."""
    found: list[Relayed] = []
    for i, marked in traceback_starts(lines):
        if marked:
            previous = next((p for p in reversed(lines[max(0, i - 3) : i]) if p.strip()), "")
            found += _embedded([previous, *lines[i : _block_end(lines, i)]])[:1]
    return found


def traceback_starts(lines: Sequence[str]) -> list[tuple[int, bool]]:
    """(line index, relayed) of every traceback in printed output."""
    starts = []
    for i, line in enumerate(lines):
        if _START.match(line):
            previous = next((p.strip() for p in reversed(lines[max(0, i - 3) : i]) if p.strip()), "")
            marked = line.lstrip().startswith("Original ") or previous == '"""' or _announces_error(previous)
            starts.append((i, marked))
    return starts


def top_level_traceback(lines: Sequence[str]) -> mltext.PyTraceback | None:
    """The last traceback in printed output that is not another process's relayed inside a message."""
    starts = traceback_starts(lines)
    for n in range(len(starts) - 1, -1, -1):
        start, marked = starts[n]
        if not marked:
            end = next((i for i, m in starts[n + 1 :] if m), len(lines))
            return mltext.parse_traceback(lines[start:end])
    return None


def _announces_error(line: str) -> bool:
    text = line.rstrip().lower()
    return text.endswith("error:") and not text.endswith("following exception:")


def _block_end(lines: Sequence[str], start: int) -> int:
    """Where a printed traceback that starts at `start` ends: after its exception line."""
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.startswith((" ", "\t")) or not line.strip() or _QUOTES.match(line):
            continue
        return i + 1
    return len(lines)


def _first_int(pattern: re.Pattern[str], text: str) -> int | None:
    m = pattern.search(text)
    return int(m[1]) if m else None


def short_type(name: str) -> str:
    """'concurrent.futures.process.BrokenProcessPool' -> 'BrokenProcessPool'."""
    return name.rpartition(".")[2]


def same_exception(recorded: UncaughtException, printed: mltext.PyTraceback) -> bool:
    """The exception a process recorded (hooks) is the one printed: same type, same raise site (the
    innermost frame) where both have frames, and the same first line of message."""
    if short_type(recorded.type) != short_type(printed.exc_type):
        return False
    if recorded.frames and printed.frames:
        inner, shown = recorded.frames[0], printed.frames[0]
        if (inner.file, inner.line) != (shown.file, shown.line):
            return False
    first = (recorded.message.splitlines() or [""])[0].strip()
    return first == printed.message.strip() or not first or not printed.message.strip()


def attribute(
    relayed: Relayed, reporter: int | None, at: float, caught: Sequence[UncaughtException]
) -> UncaughtException:
    """The relayed exception as the exception of the process that raised it: the earliest process other
    than the reporter that formatted the same exception (the hooks' caught records), else the pid the
    text names, else unknown (pid -1). `at` stands in for its moment without a record: just before the
    reporter's."""
    tb = relayed.traceback
    source = next((c for c in caught if c.pid != reporter and same_exception(c, tb)), None)
    pid = source.pid if source else relayed.pid if relayed.pid is not None else -1
    rank = source.rank if source is not None and source.rank is not None else relayed.rank
    frames = source.frames if source is not None and source.frames else tb.frames
    return UncaughtException(
        pid,
        source.at if source else at,
        tb.exc_type,
        source.message if source else tb.message,
        frames,
        rank=rank,
    )


# --- reports and reactions ------------------------------------------------------------------------

_PROCESS_WORDS = re.compile(
    r"(?i)\b(?:process(?:es)?|worker(?:s)?|ranks?|pids?|subprocess|child(?:ren)?|exit ?codes?|exitcode|"
    r"exit status|terminated|signal)\b"
)
_NAME_TOKENS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
_NAME_WORDS = frozenset({"process", "worker", "rank", "pid", "child", "children", "subprocess", "spawn"})
_PEER_TEXT = re.compile(
    r"(?i)(?:closed|reset) by (?:the )?peer|connection (?:was )?(?:reset|closed|aborted|refused)|broken pipe|"
    r"\bEOF\b|end of file|peer (?:process )?(?:has )?(?:unexpectedly )?(?:disconnected|exited|died|crashed|"
    r"closed)|remote (?:process|worker|end|peer)|process failure|MPI_ERR_PROC_FAILED|communicator (?:was )?"
    r"aborted"
)
_PEER_TYPES = frozenset(
    {
        "BrokenPipeError",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "ConnectionRefusedError",
        "EOFError",
    }
)


def reports_on(exc: UncaughtException) -> str | None:
    """What in the exception speaks of another process (a word of its text, of its type's name, or of the
    library function or file that raised it), or None. Whether it then reports a failure depends on what
    failed before it."""
    for text in (exc.message, *(m for _, m in exc.chain)):
        m = _PROCESS_WORDS.search(text)
        if m:
            return m[0]
    for t in exc.types:
        for word in _words(short_type(t)):
            if word in _NAME_WORDS:
                return word
    if exc.frames and is_library(exc.frames[0]):  # a library's frame: the user's names mean nothing here
        inner = exc.frames[0]
        for word in (*_words(inner.function), *_words(inner.file.rpartition("/")[2].removesuffix(".py"))):
            if word in _NAME_WORDS:
                return word
    return None


def _words(name: str) -> list[str]:
    return [w.lower() for w in _NAME_TOKENS.findall(name)]


def peer_error(exc: UncaughtException) -> str | None:
    """A communication error with a peer (gloo/NCCL/MPI "closed/reset by peer", a broken pipe, EOF on a
    queue): the words that say so, or None."""
    for t in exc.types:
        if short_type(t) in _PEER_TYPES:
            return short_type(t)
    for text in (exc.message, *(m for _, m in exc.chain)):
        m = _PEER_TEXT.search(text)
        if m:
            return m[0]
    return None


def named_ends(texts: Iterable[str]) -> list[tuple[int, int]]:
    """(index, exit code) of each process a report names with its end: "process 1 terminated with exit
    code 3" (torch.multiprocessing.spawn), "rank 2 ... exit code 1"."""
    return [(int(m[1]), int(m[2])) for text in texts for m in _NAMED_END.finditer(text)]

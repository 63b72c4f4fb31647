"""`jobwarden logs`: one job's output, or several jobs' interleaved line by line, each line prefixed.

`-f` starts at the last 10 lines, as `tail -f` and `pm2 logs` do (a 1 GiB log is not replayed to follow
what comes next); `-n all` starts at the beginning. What is followed is read from the offset where the
first part stopped, so that nothing the job writes in between is lost or shown twice.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden import config
from jobwarden.clock import SystemClock
from jobwarden.errors import UsageError

FOLLOW_TAIL = 10  # what `logs -f` shows before following, as tail -f does
POLL_S = 0.1
HELD_MAX = 64 << 10  # a line still without its newline (a progress bar) is shown once it is this long
LABEL_MAX = 24  # a prefix's name is cut to this: the lines stay readable with long names
_PREFIX_COLOURS = ("36", "35", "33", "34", "32", "96", "95", "93")  # never red: red is a failure


class JobOutput:
    """The job's bytes on our stdout: exact into a pipe or a file; into a terminal through the sanitiser,
    with the job's colours kept (as `less -R` does; not with NO_COLOR) and its carriage returns (a
    progress bar redraws its line), a sequence cut between two reads held back until it is whole."""

    def __init__(self) -> None:
        from jobwarden.text.sanitize import TerminalStream

        self.stream = None
        if sys.stdout.isatty():
            self.stream = TerminalStream(colours=not os.environ.get("NO_COLOR"), carriage_returns=True)

    def write(self, data: bytes) -> None:
        if self.stream is not None:
            data = self.stream.feed(data).encode("utf-8", "replace")
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def close(self) -> None:
        if self.stream is not None:
            sys.stdout.buffer.write(self.stream.close().encode("utf-8", "replace"))
        sys.stdout.buffer.flush()


@dataclass
class _Source:
    """One job's log as `logs` reads it."""

    job_id: int
    name: str
    run: Any  # RunRecord
    path: Path
    index: Path
    offset: int = 0
    prefix: bytes = b""
    held: bytes = b""  # the start of a line whose newline has not come yet

    def done(self, procfs: Any) -> bool:
        """The run's supervisor is gone: once what it left is read, nothing more comes."""
        from jobwarden.control.shimproc import shim_alive

        run = self.run
        return not shim_alive(procfs, run.shim_pid, run.shim_start) if run.shim_pid else True


def logs(home: Path, procfs: Any, args: argparse.Namespace) -> int:
    refs: list[str] = args.job
    lines = config.parse_lines(args.lines) if args.lines is not None else None
    if args.lines is None and args.follow and not args.since:
        lines = FOLLOW_TAIL
    if len(refs) > 1 and args.run is not None:
        raise UsageError(
            "logs --run goes with one JOB: each job counts its own runs",
            "e.g. jobwarden logs 3 --run 2, or drop --run to see each job's last run",
        )
    sources = _sources(home, refs, args.run)
    since = None
    if args.since:  # streamed: `logs --since 2d` of a 1 GiB log holds a chunk, never the range
        since = SystemClock().wall() - config.parse_duration(args.since, "--since")
    if len(sources) == 1:
        return _one(sources[0], procfs, lines, since, args.follow)
    return _several(sources, procfs, lines, since, args.follow)


def _sources(home: Path, refs: list[str], run_n: int | None) -> list[_Source]:
    from jobwarden.store import Store

    sources: list[_Source] = []
    with Store(home) as store:
        for ref in refs:
            job = store.job(ref)
            if any(s.job_id == job.id for s in sources):  # `logs -f 3 @last` when 3 is the last
                continue
            run = store.run(job.id, run_n)
            path = store.layout.output_log(job.id, run.n)
            sources.append(_Source(job.id, job.name, run, path, store.layout.output_index(job.id, run.n)))
    return sources


def _start(source: _Source, since: float | None) -> int:
    from jobwarden.store.logfiles import line_start, since_offset

    return line_start(source.path, since_offset(source.index, since)) if since is not None else 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _one(source: _Source, procfs: Any, lines: int | None, since: float | None, follow: bool) -> int:
    from jobwarden.store.logfiles import follow as follow_log
    from jobwarden.store.logfiles import stream_from, tail_lines

    out = JobOutput()
    start = _start(source, since)
    try:
        if lines is not None:
            end = _size(source.path)  # followed from here: what is written after the tail is read next
            out.write(b"".join(tail_lines(source.path, lines, start=start, end=end)))
            start = max(start, end)
        elif not follow:
            for chunk in stream_from(source.path, start):
                out.write(chunk)
        if follow:
            for chunk in follow_log(source.path, start, lambda: source.done(procfs), POLL_S):
                out.write(chunk)
    except KeyboardInterrupt:
        out.close()
        return 130
    out.close()
    return 0


# --- several jobs: line by line, each line prefixed by its job ----------------------------------------


def _several(
    sources: list[_Source], procfs: Any, lines: int | None, since: float | None, follow: bool
) -> int:
    from jobwarden.store.logfiles import read_new, stream_from, tail_lines
    from jobwarden.text.sanitize import one_line
    from jobwarden.text.term import colour_wanted

    terminal = sys.stdout.isatty()
    coloured = colour_wanted()
    labels = [f"{s.job_id} {one_line(s.name)[:LABEL_MAX]}" for s in sources]
    width = max(len(label) for label in labels)
    for i, (source, label) in enumerate(zip(sources, labels, strict=True)):
        text = f"{label.ljust(width)} |"
        if coloured:
            text = f"\033[{_PREFIX_COLOURS[i % len(_PREFIX_COLOURS)]}m{text}\033[0m"
        source.prefix = text.encode() + b" "
    writer = _LineWriter(terminal, coloured)
    try:
        for source in sources:  # what each job wrote so far, job after job
            start = _start(source, since)
            if lines is not None:
                end = _size(source.path)
                for line in tail_lines(source.path, lines, start=start, end=end):
                    writer.add(source, line)
                source.offset = max(start, end)
            elif not follow:
                for chunk in stream_from(source.path, start):
                    writer.add(source, chunk)
            else:
                source.offset = start
            if not follow:
                writer.flush(source)
        if follow:
            _follow_several(sources, procfs, writer, read_new)
    except KeyboardInterrupt:
        return 130
    return 0


def _follow_several(sources: list[_Source], procfs: Any, writer: _LineWriter, read_new: Any) -> None:
    """Poll each log in turn until every job has ended and everything it wrote is out."""
    active = list(sources)
    while active:
        wrote = False
        for source in list(active):
            done = source.done(procfs)  # asked before the read: nothing written before the end is missed
            data, source.offset = read_new(source.path, source.offset)
            if data:
                writer.add(source, data)
                wrote = True
            elif done:
                writer.flush(source)
                active.remove(source)
        if not wrote and active:
            time.sleep(POLL_S)


class _LineWriter:
    """Whole lines, each after its job's prefix. Into a pipe, the job's bytes as they are; into a
    terminal, through the sanitiser (colours kept unless NO_COLOR), a progress bar's redraws as their
    last frame: lines of several jobs interleave, so no line may be redrawn in place."""

    def __init__(self, terminal: bool, colours: bool) -> None:
        self.terminal, self.colours = terminal, colours

    def add(self, source: _Source, data: bytes) -> None:
        data = source.held + data
        complete, newline, source.held = data.rpartition(b"\n")
        if newline:
            self._write(source, complete.split(b"\n"))
        if len(source.held) >= HELD_MAX:  # a line that never ends (a bar with only \r): shown as it is now
            self.flush(source)

    def flush(self, source: _Source) -> None:
        if source.held:
            held, source.held = source.held, b""
            self._write(source, [held])

    def _write(self, source: _Source, lines: list[bytes]) -> None:
        out = bytearray()
        for line in lines:
            out += source.prefix
            out += self._shown(line) if self.terminal else line
            out += b"\n"
        sys.stdout.buffer.write(bytes(out))
        sys.stdout.buffer.flush()

    def _shown(self, line: bytes) -> bytes:
        from jobwarden.text.sanitize import last_frame, terminal_text

        text = terminal_text(last_frame(line.decode("utf-8", "replace")), colours=self.colours)
        if self.colours and "\x1b[" in text:  # a colour the line left on must not paint the next prefix
            text += "\x1b[0m"
        return text.encode("utf-8", "replace")

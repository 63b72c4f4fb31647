"""`jobwarden logs`: one job's output, or several jobs' interleaved line by line, each line prefixed.

`-f` starts at the last 10 lines, as `tail -f` and `pm2 logs` do (a 1 GiB log is not replayed to follow
what comes next); `-n all` starts at the beginning. What is followed is read from the offset where the
first part stopped, so that nothing the job writes in between is lost or shown twice. A job that restarts
is followed on into its next run, as `pm2 logs` does (a line on stderr says so), unless `--run` named one.
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
from jobwarden.model import JobState

FOLLOW_TAIL = 10  # what `logs -f` shows before following, as tail -f does
POLL_S = 0.1
NEXT_RUN_EVERY_S = 1.0  # how often a follower asks the store whether the job started another run
HELD_MAX = 64 << 10  # a line still without its newline (a progress bar) is shown once it is this long
LABEL_MAX = 24  # a prefix's name is cut to this: the lines stay readable with long names
_PREFIX_COLOURS = ("36", "35", "33", "34", "32", "96", "95", "93")  # never red: red is a failure


class JobOutput:
    """The job's bytes on our stdout. Into a terminal through the sanitiser, with the job's colours kept
    (as `less -R` does; not with NO_COLOR) and its carriage returns (a progress bar redraws its line), a
    sequence cut between two reads held back until it is whole. Into a pipe or a file, each line as its
    last frame (what the terminal and the web show: `logs -n 3 | wc -c` counts three lines, not every
    redraw of a bar), the bytes otherwise exact; `raw`: every byte as written."""

    def __init__(self, raw: bool = False) -> None:
        from jobwarden.text.sanitize import TerminalStream

        self.stream: TerminalStream | LastFrames | None = None
        if sys.stdout.isatty():
            self.stream = TerminalStream(colours=not os.environ.get("NO_COLOR"), carriage_returns=True)
        elif not raw:
            self.stream = LastFrames()

    def write(self, data: bytes) -> None:
        if self.stream is not None:
            data = _encoded(self.stream.feed(data))
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def close(self) -> None:
        if self.stream is not None:
            sys.stdout.buffer.write(_encoded(self.stream.close()))
        sys.stdout.buffer.flush()


def _encoded(shown: str | bytes) -> bytes:
    return shown.encode("utf-8", "replace") if isinstance(shown, str) else shown


class LastFrames:
    """A byte stream with each line cut to its last frame, for a pipe: a line still without its newline
    is held (its frames but the last dropped as they come, so a bar that never ends its line holds at
    most HELD_MAX) and given as it stands at close()."""

    def __init__(self) -> None:
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        complete, newline, self.held = (self.held + data).rpartition(b"\n")
        if len(self.held) > HELD_MAX:
            self.held = self.held[max(0, self.held.rfind(b"\r")) :]
        if not newline:
            return b""
        return b"".join(last_frame_bytes(line) + b"\n" for line in complete.split(b"\n"))

    def close(self) -> bytes:
        held, self.held = self.held, b""
        return last_frame_bytes(held)


def last_frame_bytes(line: bytes) -> bytes:
    """A line redrawn with carriage returns as its last frame; the carriage return of a CRLF is kept."""
    body = line.rstrip(b"\r")
    return body.rsplit(b"\r", 1)[-1] + line[len(body) :]


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


class LaterRuns:
    """Whether the job followed has started a run after the one being read (a restart, the same shim's
    or a new one's), asked of the store at most every NEXT_RUN_EVERY_S. `pinned` (--run N): never."""

    def __init__(self, home: Path, pinned: bool) -> None:
        self.home, self.pinned = home, pinned
        self._asked: dict[int, float] = {}
        self._found: dict[int, _Source] = {}  # job id -> its latest run, when later than the one read

    def after(self, source: _Source, now_or_never: bool = False) -> _Source | None:
        """The job's latest run, to be read, when it is later than the one `source` reads; else None.
        `now_or_never`: the run's supervisor is gone, ask the store now (a quick restart may already
        have come and gone within the interval)."""
        if self.pinned:
            return None
        found = self._found.get(source.job_id)
        if found is not None and found.run.n > source.run.n:
            return found
        now = time.monotonic()
        if not now_or_never and now - self._asked.get(source.job_id, -NEXT_RUN_EVERY_S) < NEXT_RUN_EVERY_S:
            return None
        self._asked[source.job_id] = now
        latest = source_of(self.home, str(source.job_id), None)
        if latest.run.n <= source.run.n:
            return None
        self._found[source.job_id] = latest
        return latest

    @staticmethod
    def move_on(source: _Source, later: _Source) -> None:
        """Read `later`'s run from its start from now on; say so on stderr (stdout stays the job's bytes)."""
        source.run, source.path, source.index = later.run, later.path, later.index
        source.offset, source.held = 0, b""
        said = f"jobwarden: job {source.job_id} started run {source.run.n}; following its output"
        print(said, file=sys.stderr, flush=True)


def follow_runs(source: _Source, start: int, procfs: Any, later: LaterRuns, out: JobOutput) -> None:
    """`source`'s output from `start` as it comes, then each later run's, until the last run's supervisor
    is gone and everything it wrote is out (`logs -f`, `run -f`)."""
    from jobwarden.store.logfiles import follow

    while True:

        def ended() -> bool:
            return source.done(procfs) or later.after(source) is not None

        for chunk in follow(source.path, start, ended, POLL_S):
            out.write(chunk)
        next_run = later.after(source, now_or_never=True)
        if next_run is None:
            return
        later.move_on(source, next_run)
        start = 0


def logs(home: Path, procfs: Any, args: argparse.Namespace) -> int:
    from jobwarden.store.repo import LAST_JOB

    refs: list[str] = args.job or [LAST_JOB]
    lines = config.parse_lines(args.lines) if args.lines is not None else None
    if args.lines is None and args.follow and not args.since:
        lines = FOLLOW_TAIL
    if len(refs) > 1 and args.run is not None:
        raise UsageError(
            "logs --run goes with one JOB: each job counts its own runs",
            "e.g. jobwarden logs 3 --run 2, or drop --run to see each job's last run",
        )
    sources = _sources(home, refs, args.run)
    if not args.job:
        say_newest("logs", sources[0].job_id, sources[0].name)
    later = LaterRuns(home, pinned=args.run is not None)
    since = None
    if args.since:  # streamed: `logs --since 2d` of a 1 GiB log holds a chunk, never the range
        since = SystemClock().wall() - config.parse_duration(args.since, "--since")
    if len(sources) == 1:
        status = _one(sources[0], procfs, lines, since, args.follow, later, args.raw)
        if args.follow and status == 0:
            say_the_end(home, sources[0])
        return status
    return _several(sources, procfs, lines, since, args.follow, later, args.raw)


def say_newest(command: str, job_id: int, name: str) -> None:
    """With no JOB, `status` and `logs` show the newest job (as pm2 and pueue show what there is): which
    one is said on stderr, so that a pipe or --json gets the output alone."""
    from jobwarden.text.sanitize import terminal_text

    print(
        f"jobwarden {command}: no JOB given: job {job_id} ({terminal_text(name)}), the newest",
        file=sys.stderr,
    )


def _sources(home: Path, refs: list[str], run_n: int | None) -> list[_Source]:
    sources: list[_Source] = []
    for ref in refs:
        source = source_of(home, ref, run_n)
        if all(s.job_id != source.job_id for s in sources):  # `logs -f 3 @last` when 3 is the last
            sources.append(source)
    return sources


def source_of(home: Path, ref: str, run_n: int | None) -> _Source:
    """Run `run_n` of the job `ref` names (its latest by default), to be read."""
    from jobwarden.store import Store

    with Store(home) as store:
        job = store.job(ref)
        run = store.run(job.id, run_n)
        log, index = store.layout.output_log(job.id, run.n), store.layout.output_index(job.id, run.n)
        return _Source(job.id, job.name, run, log, index)


def _start(source: _Source, since: float | None) -> int:
    from jobwarden.store.logfiles import line_start, since_offset

    return line_start(source.path, since_offset(source.index, since)) if since is not None else 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _one(
    source: _Source,
    procfs: Any,
    lines: int | None,
    since: float | None,
    follow: bool,
    later: LaterRuns,
    raw: bool,
) -> int:
    from jobwarden.store.logfiles import stream_from, tail_lines

    out = JobOutput(raw)
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
            follow_runs(source, start, procfs, later, out)
    except KeyboardInterrupt:
        out.close()
        return 130
    out.close()
    return 0


def say_the_end(home: Path, source: _Source) -> None:
    """`logs -f` ends when the job does: how it ended, on stderr, as `run -f` says it (never silently)."""
    from jobwarden.store import Store
    from jobwarden.text.ending import end_line

    with Store(home) as store:
        run = store.run(source.job_id, source.run.n)  # the last run followed, as it is now
    if run.state.is_ended or run.state == JobState.LOST:
        print(end_line(source.name, run), file=sys.stderr)


# --- several jobs: line by line, each line prefixed by its job ----------------------------------------


def _several(
    sources: list[_Source],
    procfs: Any,
    lines: int | None,
    since: float | None,
    follow: bool,
    later: LaterRuns,
    raw: bool,
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
    writer = _LineWriter(terminal, coloured, raw)
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
            _follow_several(sources, procfs, writer, read_new, later)
    except KeyboardInterrupt:
        return 130
    return 0


def _follow_several(
    sources: list[_Source], procfs: Any, writer: _LineWriter, read_new: Any, later: LaterRuns
) -> None:
    """Poll each log in turn until every job has ended and everything it wrote is out; a job that
    restarts is followed on into its next run."""
    active = list(sources)
    while active:
        wrote = False
        for source in list(active):
            # asked before the read: nothing written before the end (or the next run's start) is missed
            done = source.done(procfs)
            next_run = later.after(source)
            data, source.offset = read_new(source.path, source.offset)
            if data:
                writer.add(source, data)
                wrote = True
                continue
            if done and next_run is None:
                next_run = later.after(source, now_or_never=True)
            if next_run is not None:
                writer.flush(source)
                later.move_on(source, next_run)
                wrote = True  # read the next run's log at once
            elif done:
                writer.flush(source)
                active.remove(source)
        if not wrote and active:
            time.sleep(POLL_S)


class _LineWriter:
    """Whole lines, each after its job's prefix, a progress bar's redraws as their last frame (lines of
    several jobs interleave, so no line may be redrawn in place). Into a terminal through the sanitiser
    (colours kept unless NO_COLOR); into a pipe the job's bytes, every one with `raw`."""

    def __init__(self, terminal: bool, colours: bool, raw: bool) -> None:
        self.terminal, self.colours, self.raw = terminal, colours, raw

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
            out += self._shown(line) if self.terminal else line if self.raw else last_frame_bytes(line)
            out += b"\n"
        sys.stdout.buffer.write(bytes(out))
        sys.stdout.buffer.flush()

    def _shown(self, line: bytes) -> bytes:
        from jobwarden.text.sanitize import last_frame, terminal_text

        text = terminal_text(last_frame(line.decode("utf-8", "replace")), colours=self.colours)
        if self.colours and "\x1b[" in text:  # a colour the line left on must not paint the next prefix
            text += "\x1b[0m"
        return text.encode("utf-8", "replace")

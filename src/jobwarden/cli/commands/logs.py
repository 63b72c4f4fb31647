"""`jobwarden logs`: one job's output, or several jobs' interleaved line by line, each line prefixed.

`-f` starts at the last 10 lines, as `tail -f` and `pm2 logs` do (a 1 GiB log is not replayed to follow
what comes next); `-n all` starts at the beginning. What is followed is read from the offset where the
first part stopped, so that nothing the job writes in between is lost or shown twice. A job that restarts
is followed on into its next run, as `pm2 logs` does (a line on stderr says so), unless `--run` named one."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from jobwarden import config
from jobwarden.cli.common import open_procfs
from jobwarden.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from jobwarden.cli.joboutput import LaterRuns, Source

HELP = "show a job's output"


def add_arguments(logs: argparse.ArgumentParser) -> None:
    logs.add_argument(
        "job",
        metavar="JOB",
        nargs="*",
        help="an id, a name (its newest job) or @last (the default); several: their lines interleaved, each "
        "prefixed",
    )
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print the last 10 lines (see -n), then what the job writes until it ends, its restarts too",
    )
    logs.add_argument(
        "-n", "--lines", metavar="N|all", help="only the last N lines (default: all; with -f, 10)"
    )
    logs.add_argument("--since", metavar="DUR", help="only output written in the last DUR (e.g. 10m)")
    logs.add_argument("--run", type=int, metavar="N", help="an earlier attempt (with -f: that run only)")
    logs.add_argument(
        "--raw",
        action="store_true",
        help="into a pipe, every byte as written (default: a line redrawn with \\r as its last frame, as "
        "a terminal shows it; a terminal always gets the output sanitised)",
    )


def handle(args: argparse.Namespace) -> int:
    from jobwarden.paths import home_dir

    return logs(home_dir(), open_procfs(), args)


FOLLOW_TAIL = 10  # what `logs -f` shows before following, as tail -f does


LABEL_MAX = 24  # a prefix's name is cut to this: the lines stay readable with long names


_PREFIX_COLOURS = ("36", "35", "33", "34", "32", "96", "95", "93")  # never red: red is a failure


def logs(home: Path, procfs: Any, args: argparse.Namespace) -> int:
    from jobwarden.cli.joboutput import LaterRuns, say_newest, say_the_end
    from jobwarden.clock import SystemClock
    from jobwarden.control.jobs import LAST_JOB

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


def _sources(home: Path, refs: list[str], run_n: int | None) -> list[Source]:
    from jobwarden.cli.joboutput import source_of

    sources: list[Source] = []
    for ref in refs:
        source = source_of(home, ref, run_n)
        if all(s.job_id != source.job_id for s in sources):  # `logs -f 3 @last` when 3 is the last
            sources.append(source)
    return sources


def _start(source: Source, since: float | None) -> int:
    from jobwarden.control.views.joblog import line_start, since_offset

    return line_start(source.path, since_offset(source.index, since)) if since is not None else 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _one(
    source: Source,
    procfs: Any,
    lines: int | None,
    since: float | None,
    follow: bool,
    later: LaterRuns,
    raw: bool,
) -> int:
    from jobwarden.cli.joboutput import JobOutput, follow_runs
    from jobwarden.control.views.joblog import stream_from, tail_lines

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


# --- several jobs: line by line, each line prefixed by its job ----------------------------------------


def _several(
    sources: list[Source],
    procfs: Any,
    lines: int | None,
    since: float | None,
    follow: bool,
    later: LaterRuns,
    raw: bool,
) -> int:
    from jobwarden.control.views.joblog import read_new, stream_from, tail_lines
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
    sources: list[Source], procfs: Any, writer: _LineWriter, read_new: Any, later: LaterRuns
) -> None:
    """Poll each log in turn until every job has ended and everything it wrote is out; a job that
    restarts is followed on into its next run."""
    from jobwarden.cli.joboutput import POLL_S

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

    def add(self, source: Source, data: bytes) -> None:
        from jobwarden.cli.joboutput import HELD_MAX

        data = source.held + data
        complete, newline, source.held = data.rpartition(b"\n")
        if newline:
            self._write(source, complete.split(b"\n"))
        if len(source.held) >= HELD_MAX:  # a line that never ends (a bar with only \r): shown as it is now
            self.flush(source)

    def flush(self, source: Source) -> None:
        if source.held:
            held, source.held = source.held, b""
            self._write(source, [held])

    def _write(self, source: Source, lines: list[bytes]) -> None:
        from jobwarden.cli.joboutput import last_frame_bytes

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

"""A job's output as its followers read it: the log of one run (`Source`), the runs a restart starts
after it (`LaterRuns`), and the stdout that shows it (`JobOutput`), for `logs`, `run -f` and `status`."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.model import JobState

POLL_S = 0.1
NEXT_RUN_EVERY_S = 1.0  # how often a follower asks the store whether the job started another run
HELD_MAX = 64 << 10  # a line still without its newline (a progress bar) is shown once it is this long


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
class Source:
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
        self._found: dict[int, Source] = {}  # job id -> its latest run, when later than the one read

    def after(self, source: Source, now_or_never: bool = False) -> Source | None:
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
    def move_on(source: Source, later: Source) -> None:
        """Read `later`'s run from its start from now on; say so on stderr (stdout stays the job's bytes)."""
        source.run, source.path, source.index = later.run, later.path, later.index
        source.offset, source.held = 0, b""
        said = f"jobwarden: job {source.job_id} started run {source.run.n}; following its output"
        print(said, file=sys.stderr, flush=True)


def follow_runs(source: Source, start: int, procfs: Any, later: LaterRuns, out: JobOutput) -> None:
    """`source`'s output from `start` as it comes, then each later run's, until the last run's supervisor
    is gone and everything it wrote is out (`logs -f`, `run -f`)."""
    from jobwarden.control.views.joblog import follow

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


def say_newest(command: str, job_id: int, name: str) -> None:
    """With no JOB, `status` and `logs` show the newest job (as pm2 and pueue show what there is): which
    one is said on stderr, so that a pipe or --json gets the output alone."""
    from jobwarden.text.sanitize import terminal_text

    print(
        f"jobwarden {command}: no JOB given: job {job_id} ({terminal_text(name)}), the newest",
        file=sys.stderr,
    )


def source_of(home: Path, ref: str, run_n: int | None) -> Source:
    """Run `run_n` of the job `ref` names (its latest by default), to be read."""
    from jobwarden.control.views.joblog import run_log

    found = run_log(home, ref, run_n)
    return Source(found.job_id, found.name, found.run, found.path, found.index_file)


def say_the_end(home: Path, source: Source) -> None:
    """`logs -f` ends when the job does: how it ended, on stderr, as `run -f` says it (never silently)."""
    from jobwarden.control.jobs import stored_run
    from jobwarden.text.ending import end_line

    run = stored_run(home, source.job_id, source.run.n)  # the last run followed, as it is now
    if run.state.is_ended or run.state == JobState.LOST:
        print(end_line(source.name, run), file=sys.stderr)

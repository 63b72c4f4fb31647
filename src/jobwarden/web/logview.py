"""A run's output over HTTP: the last lines as text, a byte range as JSON, the whole file, and a live
stream (Server-Sent Events) whose event ids are byte offsets, so a reconnect resumes where it broke off.

Offsets are the natural cursor: the job appends to output.log and never rewrites it (store/logfiles.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple

from jobwarden.control.views.joblog import read_from, read_piece, run_log, tail_lines
from jobwarden.web import params
from jobwarden.web.app import App
from jobwarden.web.messages import HTTPProblem, Request, Response, json_response, text_response

MAX_CHUNK = 1 << 20  # bytes per JSON answer or stream event: a 100 GiB log is read in bounded pieces
DEFAULT_TAIL_BYTES = 64 << 10  # where a stream without a cursor starts: the last lines, not the whole log
STATE_CHECK_S = 2.0  # how often a stream re-reads the run's state from the store


class RunLog(NamedTuple):
    job_id: int
    run: int
    path: Path


def find_log(app: App, ref: str, req: Request) -> RunLog:
    found = run_log(app.home, ref, req.int_param("run", minimum=1))
    return RunLog(found.job_id, found.run.n, found.path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def log(app: App, req: Request, ref: str) -> Response:
    """`?tail=N`: the last N lines (text). `?offset=O[&limit=L]`: {offset, next_offset, size, text}.
    Neither: the whole file (text), sent in pieces by the server."""
    found = find_log(app, ref, req)
    tail, offset = req.int_param("tail"), req.int_param("offset")
    if tail is not None:
        return text_response(b"".join(tail_lines(found.path, tail)))
    if offset is not None:
        limit = min(req.int_param("limit", minimum=1) or MAX_CHUNK, MAX_CHUNK)
        size = _size(found.path)
        data, next_offset = _piece(found.path, offset, limit)
        return json_response(
            {"offset": offset, "next_offset": next_offset, "size": size, "text": decode(data)}
        )
    response = text_response(b"")
    response.file = found.path
    return response


def _piece(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """The log from `offset` (read_piece: a range --log-max freed is one marker line), cut to whole lines
    and characters when the read was cut at `limit`; and the offset after it."""
    data, next_offset = read_piece(path, offset, limit)
    if next_offset - offset != len(data):  # a marker for a freed range: whole already
        return data, next_offset
    data = whole_lines(data, limit)
    return data, offset + len(data)


def whole_lines(data: bytes, limit: int) -> bytes:
    """A piece cut at the last line end when the read was cut short, so a line and a UTF-8 character are
    never split between two pieces; a piece with no line end (a progress bar) is cut at a character."""
    if len(data) < limit:
        return _whole_characters(data)
    end = data.rfind(b"\n")
    if end >= 0:
        return data[: end + 1]
    return _whole_characters(data)


def _whole_characters(data: bytes) -> bytes:
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # the lead byte of a character that may be cut
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= needed else data[:-back]
    return data


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def start_offset(req: Request, path: Path) -> int:
    """Where a stream starts: `Last-Event-ID` (the browser's reconnect), `?offset=`, else the start of a
    line near the end of the log."""
    resume = req.headers.get("Last-Event-ID")
    if resume is not None:
        try:
            return params.whole_number("Last-Event-ID", resume.strip())
        except params.BadParameter as err:
            raise HTTPProblem(400, str(err)) from None
    offset = req.int_param("offset")
    if offset is not None:
        return offset
    size = _size(path)
    if size <= DEFAULT_TAIL_BYTES:
        return 0
    base = size - DEFAULT_TAIL_BYTES
    newline = read_from(path, base, align_to_line=False, limit=DEFAULT_TAIL_BYTES).find(b"\n")
    return base + newline + 1 if newline >= 0 else base


class RunEnd:
    """Whether the streamed run is over: its shim gone (a cheap /proc read each poll) or, read from the
    store every few seconds, its state ended (a restarting job's shim lives on into the next attempt)."""

    def __init__(self, app: App, found: RunLog) -> None:
        self.app, self.found = app, found
        self.checked_at = 0.0
        self.state: dict[str, object] | None = None

    def over(self) -> bool:
        if self.state is not None:
            return True
        now = time.monotonic()
        if now - self.checked_at < STATE_CHECK_S:
            return False
        self.checked_at = now
        from jobwarden.control.views.joblist import current_run
        from jobwarden.model import JobState

        run = current_run(self.app.home, self.app.procfs, self.found.job_id, self.found.run)
        if run.state.is_ended or run.state == JobState.LOST:
            self.state = {"state": str(run.state), "exit_code": run.exit_code, "signal": run.signal}
            return True
        return False


def event(name: str, data: object, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def follower(app: App, req: Request, ref: str) -> LogFollower:
    """The stream route's handler: the run's log and where to start; the server then polls the follower
    (web/asgi.py), so no thread waits for a quiet job."""
    found = find_log(app, ref, req)
    return LogFollower(app, found, start_offset(req, found.path))


class LogFollower:
    """The log from an offset as it grows, as Server-Sent Events, until the run is over and everything
    was sent. Each `poll` reads what is there now; the caller waits between polls and sends heartbeats."""

    def __init__(self, app: App, found: RunLog, offset: int) -> None:
        self.found, self.offset = found, offset
        self.end = RunEnd(app, found)
        self.finished = False

    def poll(self) -> bytes:
        """The next event: a piece of the log, else the end once the run is over; b"" for nothing new."""
        over = self.end.over()  # read before the data: nothing written before the end is missed
        path, offset = self.found.path, self.offset
        data, self.offset = _piece(path, offset, MAX_CHUNK)
        if data:
            return event("log", {"offset": offset, "text": decode(data)}, self.offset)
        if over:
            self.finished = True
            return event("end", {**(self.end.state or {}), "offset": offset}, offset)
        return b""

"""uvicorn's HTTP/1.1 protocol (h11), with what a server that any local user can reach needs besides.

h11 caps a request's head (`max_head_bytes`, then 431) and uvicorn closes a kept-alive connection idle
for `keep_alive_s` after an answer. What neither does (uvicorn 0.54): give a connection a deadline to
send its request. A connection that sends nothing, or half a head and then a byte now and then (each byte
cancels uvicorn's keep-alive timer), is kept for ever: slowloris. Nor are connections counted. So here:

- a deadline for each request's head, `head_timeout_s` from the connection or from the end of the last
  answer: a connection still idle then is closed;
- a cap on connections, `max_connections` (below the process's file limit): a newcomer past it closes the
  connection idle the longest (idle: no request in progress, so one that sent nothing or half a head),
  so a crowd of idle connections never keeps a real client out; when every connection is busy with a
  request, the newcomer gets a 503;
- a malformed request gets a JSON answer naming what h11 found wrong, and one line of log (rate-limited:
  anyone can send them).

The standard library's threading server held a thread per connection with no deadline, so idle
connections from any local user took the dashboard down (issue 20).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import time
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from jobwarden.web.app import Limits, log_line

_REASONS = {400: b"Bad Request", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
_QUIET = {"Invalid HTTP request received."}  # uvicorn's words for what GuardedProtocol logs better
LOG_EVERY_S = 1.0  # at most one line a second about what clients without the token do


class ConnectionGuard:
    """The open connections of one server, and the rate at which their misdeeds are logged."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # every open connection, the one idle the longest first (moved to the end when it goes idle)
        self.open: OrderedDict[GuardedProtocol, None] = OrderedDict()
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # newcomers turned away: every connection was busy
        self._logged_at = -math.inf
        self._unlogged = 0

    def admit(self, newcomer: GuardedProtocol) -> bool:
        if len(self.open) >= self.limits.max_connections:
            # the first idle one in order: only the busy ones (a request in progress) are passed over
            oldest = next((conn for conn in self.open if conn.is_idle()), None)
            if oldest is None:
                self.refused += 1
                self.note(f"{len(self.open)} connections busy: refused one ({self.refused} so far)")
                return False
            oldest.close_now()
            self.evicted += 1
            self.note(f"{len(self.open) + 1} connections: closed the longest idle ({self.evicted} so far)")
        self.open[newcomer] = None
        return True

    def went_idle(self, conn: GuardedProtocol) -> None:
        if conn in self.open:
            self.open.move_to_end(conn)

    def note(self, line: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more lines like this not shown)" if self._unlogged else ""
        self._logged_at, self._unlogged = now, 0
        log_line(line + more)


class GuardedProtocol(H11Protocol):
    """One connection. `guard` is set on the subclass each server makes (web/server.py)."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.guard.admit(self):
            self._await_head()
        else:
            self._refuse()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.open.pop(self, None)
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        self._await_head()  # before uvicorn starts a pipelined request, which makes us busy again
        super().on_response_complete()

    def is_idle(self) -> bool:
        """No request in progress: nothing sent yet, half a head, or between two requests."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def close_now(self) -> None:
        self.guard.open.pop(self, None)
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this inside its `except h11.RemoteProtocolError`: answer in JSON, with h11's
        reason and status (431 for a head too large), on one line of log."""
        err = sys.exc_info()[1]
        status = err.error_status_hint if isinstance(err, h11.RemoteProtocolError) else 400
        if status == 431:
            message = f"the request's line and headers are over {self.guard.limits.max_head_bytes} bytes"
        else:
            status, message = 400, f"bad request: {str(err or msg)[:200]}"
        self.guard.note(f"{status} from a client: {message}")
        body = json.dumps({"error": message, "remedy": None}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (h11.Response(status_code=status, headers=headers, reason=_REASONS[status]),
                          h11.Data(data=body), h11.EndOfMessage()):  # fmt: skip
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:  # no answer fits the connection's state any more
            pass
        self.close_now()

    def _refuse(self) -> None:
        body = json.dumps({"error": "the server is busy: too many connections", "remedy": None}).encode()
        head = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        self.transport.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        self.close_now()

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self.guard.went_idle(self)
        self._head_timer = self.loop.call_later(self.guard.limits.head_timeout_s, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.is_idle():
            self.close_now()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def protocol_for(limits: Limits) -> type[GuardedProtocol]:
    """A protocol class with its own guard: one per server, so two servers in one process (tests) do
    not share a count."""
    return type("Guarded", (GuardedProtocol,), {"guard": ConnectionGuard(limits)})


class OneLineLog(logging.Handler):
    """uvicorn's and asyncio's own messages as lines of the server's log: one line each, no traceback
    (a user never sees one), made safe by `log_line`, each kind at most once a second (what a flood of
    clients makes them say must not flood the terminal)."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self._said: dict[str, tuple[float, int]] = {}  # message template: when last shown, how many since

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text in _QUIET:
            return
        now, (shown_at, unshown) = time.monotonic(), self._said.get(str(record.msg), (-math.inf, 0))
        if now - shown_at < LOG_EVERY_S:
            self._said[str(record.msg)] = (shown_at, unshown + 1)
            return
        self._said[str(record.msg)] = (now, 0)
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text}: {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        log_line(text + (f" ({unshown} more like this not shown)" if unshown else ""))


def route_library_logs() -> None:
    """Warnings and errors of uvicorn and asyncio go to `OneLineLog` only; their info lines nowhere."""
    for name in ("uvicorn", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, OneLineLog) for h in logger.handlers):
            logger.addHandler(OneLineLog(logging.WARNING))
        logger.setLevel(logging.WARNING)
        logger.propagate = False

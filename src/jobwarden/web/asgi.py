"""The dashboard as an ASGI application, the interface uvicorn serves (web/server.py).

Each request passes the gate (web/gate.py) on the event loop: it is cheap (no store, no file), so a
flood of requests without the token costs no thread. Only then does its handler run, on one of a few
worker threads (SQLite reads; a stop waits for the job). The answer is written here: JSON and pages at
once, a whole log in pieces, the log stream as Server-Sent Events polled from the loop, so no thread
waits on a quiet job. Every failure ends in one funnel: the client gets JSON with a message, the server's
log one line, nobody a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from jobwarden.control.views.joblog import iter_output, output_length
from jobwarden.errors import JobNotFound, JobwardenError, StoreError, UsageError
from jobwarden.web import gate
from jobwarden.web.app import App
from jobwarden.web.logview import LogFollower
from jobwarden.web.messages import Headers, HTTPProblem, Request, Response, error_json

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")

PIECE = 1 << 20  # bytes of a whole log read and sent at a time
SECURITY_HEADERS = {
    # no inline script or style: the pages load their own files only
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class ClientGone(Exception):
    """The client closed the connection, or stopped reading for longer than the write timeout."""


class Dashboard:
    """The ASGI application: one per server, holding the worker threads."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.pool = ThreadPoolExecutor(app.limits.workers, thread_name_prefix="jobwarden-web")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":  # lifespan events are off; websockets are not served
            await Exchange(self, scope, receive, send).run()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Exchange:
    """One request and its answer."""

    def __init__(self, dashboard: Dashboard, scope: Scope, receive: Receive, send: Send) -> None:
        self.app, self.pool = dashboard.app, dashboard.pool
        self.receive, self.send = receive, send
        self.version = str(scope.get("http_version", "1.1"))
        self.req = _request(scope)
        # a body left unread (refused before it was read) is not waited for: the connection closes
        self.unread_body = "content-length" in self.req.headers or "transfer-encoding" in self.req.headers
        self.set_cookie: str | None = None

    async def run(self) -> None:
        try:
            response = await self._answer()
        except ClientGone:
            return
        except Exception as err:  # the funnel: every failure becomes an answer and one log line
            response = failure(self.app, err, self.req)
        if response is not None:
            with contextlib.suppress(ClientGone):
                await self._send_response(response)

    async def _answer(self) -> Response | None:
        if not self.version.startswith("1."):
            raise HTTPProblem(400, f"HTTP/{self.version[:10]} is not spoken here", "use HTTP/1.1")
        admitted = gate.admit(self.app, self.req)
        if isinstance(admitted, Response):
            return admitted
        self.set_cookie = admitted.set_cookie
        if self.req.method == "POST":
            self.req = dataclasses.replace(self.req, body=await self._body())
        result = await self._in_thread(admitted.route.handler, self.app, self.req, *admitted.args)
        if isinstance(result, LogFollower):
            await self._stream(result)
            return None
        response: Response = result
        return response

    async def _in_thread(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(function, *args))

    # --- reading ----------------------------------------------------------------------------------

    async def _body(self) -> bytes:
        """The whole body, at most `max_body_bytes`, arrived within `body_timeout_s`."""
        limits = self.app.limits
        length = self.req.headers.get("Content-Length") or "0"  # h11 made sure it is digits
        if int(length) > limits.max_body_bytes:
            raise HTTPProblem(413, f"the request body is over {limits.max_body_bytes} bytes")
        pieces: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                while True:
                    message = await self.receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone
                    pieces.append(message.get("body", b""))
                    size += len(pieces[-1])
                    if size > limits.max_body_bytes:
                        raise HTTPProblem(413, f"the request body is over {limits.max_body_bytes} bytes")
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise HTTPProblem(408, f"the request body took over {limits.body_timeout_s:g} s") from None
        self.unread_body = False
        return b"".join(pieces)

    async def _gone(self) -> None:
        """Returns when the client has closed the connection."""
        while (await self.receive())["type"] != "http.disconnect":
            pass

    # --- writing ----------------------------------------------------------------------------------

    async def _start(self, status: int, headers: dict[str, str]) -> None:
        headers = {**SECURITY_HEADERS, **headers}
        if self.set_cookie:
            headers["Set-Cookie"] = self.set_cookie
        if self.unread_body:
            headers["Connection"] = "close"
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await self._write_message({"type": "http.response.start", "status": status, "headers": raw})

    async def _write(self, data: bytes, more: bool = True) -> None:
        await self._write_message({"type": "http.response.body", "body": data, "more_body": more})

    async def _write_message(self, message: Message) -> None:
        """A client that takes nothing for `write_timeout_s` holds no answer open."""
        try:
            async with asyncio.timeout(self.app.limits.write_timeout_s):
                await self.send(message)
        except (TimeoutError, OSError):
            raise ClientGone from None

    async def _send_response(self, response: Response) -> None:
        end, length = await self._in_thread(_log_extent, response.file) if response.file else (0, 0)
        headers = {**response.headers, "Content-Type": response.content_type}
        headers["Content-Length"] = str(len(response.body) + length)
        await self._start(response.status, headers)
        if response.file is None or length == 0:
            await self._write(response.body, more=False)
            return
        await self._write(response.body)
        await self._send_log(response.file, end, length)
        await self._write(b"", more=False)

    async def _send_log(self, path: Path, end: int, length: int) -> None:
        """The log's first `end` bytes, a marker line where --log-max freed a range, in exactly `length`
        bytes (the Content-Length sent): the log may grow, or be trimmed, while it is being sent."""
        pieces = iter_output(path, 0, end)
        gone = asyncio.ensure_future(self._gone())  # a client that left: stop reading the file for it
        try:
            left = length
            while left > 0:
                if gone.done():
                    raise ClientGone
                piece = (await self._in_thread(next, pieces, b""))[:left]
                if not piece:  # trimmed meanwhile (a new hole): keep the length true
                    piece = b"\n" * min(left, PIECE)
                await self._write(piece)
                left -= len(piece)
        finally:
            gone.cancel()
            pieces.close()

    async def _stream(self, follower: LogFollower) -> None:
        """The log as Server-Sent Events; at most MAX_STREAMS at once. Each poll reads the file on a
        worker thread; between polls the stream waits on the loop, woken early by the client leaving."""
        app = self.app
        if not app.streams.acquire(blocking=False):
            raise HTTPProblem(503, "too many open log streams", "close some job pages")
        gone = asyncio.ensure_future(self._gone())
        try:
            await self._start(200, {"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
            await self._write(b"retry: 2000\n\n")
            quiet_since = time.monotonic()
            while not (app.stopping.is_set() or gone.done() or follower.finished):
                data = await self._in_thread(follower.poll)
                if data:
                    await self._write(data)
                    quiet_since = time.monotonic()
                    continue
                if time.monotonic() - quiet_since >= app.heartbeat_s:
                    await self._write(b": hb\n\n")
                    quiet_since = time.monotonic()
                await asyncio.wait({gone}, timeout=app.log_poll_s)
            if not gone.done():
                await self._write(b"", more=False)
        except ClientGone:
            pass
        except Exception as err:  # the headers are sent: nothing to answer, only to log
            app.log_error(f"log stream of job {follower.found.job_id} ended: {type(err).__name__}: {err}")
        finally:
            gone.cancel()
            app.streams.release()


def _request(scope: Scope) -> Request:
    """The request as the handlers see it. The path stays percent-encoded (routes decode their
    arguments once); h11 let only visible ASCII into the target, any byte from 0x80 into a header."""
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
    headers = Headers((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"])
    return Request(
        scope["method"],
        raw_path.decode("ascii", errors="replace"),
        scope["query_string"].decode("ascii", errors="replace"),
        headers,
    )


def failure(app: App, err: Exception, req: Request) -> Response:
    status, remedy = 500, ""
    if isinstance(err, HTTPProblem):
        status, message, remedy = err.status, err.message, err.remedy
    elif isinstance(err, JobwardenError):
        status = _status_of(err)
        message, remedy = err.message, err.remedy
    else:
        message = "internal error (see the server's log)"
    detail = f"{type(err).__name__}: {err}" if status == 500 else message
    app.log_error(f"{status} {req.method} {req.path}: {detail}")
    return error_json(status, message, remedy)


def _status_of(err: JobwardenError) -> int:
    if isinstance(err, JobNotFound):
        return 404
    if isinstance(err, UsageError):
        return 400
    if isinstance(err, StoreError):
        return 503
    return 409  # the job is not in a state that allows it (nothing to dump, still running...)


def _log_extent(path: Path) -> tuple[int, int]:
    """The log's size now, and how many bytes sending that much of it takes (output_length)."""
    try:
        end = path.stat().st_size
    except FileNotFoundError:  # no output yet
        return 0, 0
    return end, output_length(path, end)

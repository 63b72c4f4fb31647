"""`jobwarden web` on uvicorn: the socket bound by us (web/binding.py), the dashboard as an ASGI app
(web/asgi.py), uvicorn's h11 protocol with deadlines and a connection cap (web/connections.py).

Why uvicorn with h11 and no framework: measured here (docs/measurements.md), its import and memory cost
the least of the production servers (starlette on top adds routing this package already has; aiohttp
twice the import time), and h11 is a strict, size-capped HTTP/1.1 parser. The routes, the gate and the
handlers are ours and know nothing of it.

Signals: `serve` installs its SIGTERM and SIGINT handlers before it binds or prints anything, so a
signal sent the moment the address appears stops the server cleanly (exit 0) instead of killing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import resource
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

import uvicorn

from jobwarden.paths import ensure_private_dir
from jobwarden.web import auth
from jobwarden.web.app import App, Limits
from jobwarden.web.asgi import Dashboard
from jobwarden.web.binding import BACKLOG, Listener, listen_tcp, listen_unix
from jobwarden.web.connections import protocol_for, route_library_logs

SHUTDOWN_S = 5  # open requests get this long to finish when the server stops
# File descriptors the connection cap leaves free: the store, logs being sent, the worker threads' files;
# and accept() bursts. asyncio accepts up to `backlog` connections at once, and their protocols (which
# close the longest-idle connection to make room) run a few loop turns later, while more bursts come. A
# connection past the file limit fails in accept(), where CPython 3.11's loop then logs and reschedules
# itself once per connection left in the burst: that must never happen.
RESERVED_FDS = 64
BURSTS = 4


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, told to stop by `stop()` (from a signal handler or another thread) instead of
    by its own signal handlers, and without its 10-per-second tick while idle."""

    def __init__(self, config: uvicorn.Config, app: App) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # `serve` has its own handlers, installed before the address is printed

    def stop(self) -> None:
        self.should_exit = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing left to wake
                loop.call_soon_threadsafe(self._wake.set)

    async def main_loop(self) -> None:
        self.server_state.default_headers = list(self.config.encoded_headers)  # no Date, no Server
        self._loop = asyncio.get_running_loop()
        while not self.should_exit:
            await self._wake.wait()
            self._wake.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.app.stopping.set()  # open log streams end at their next poll
        await super().shutdown(sockets)


class Served:
    """A bound server, not yet serving: `run()` serves until `stop()` (from any thread)."""

    def __init__(self, app: App, listener: Listener, dashboard: Dashboard, server: _Uvicorn) -> None:
        self.app, self.listener, self.dashboard, self._server = app, listener, dashboard, server
        self.url = listener.url(app.token)

    @property
    def port(self) -> int | None:
        return self.listener.port

    def run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self.listener.sock]))
        finally:
            self.dashboard.close()
            self.listener.sock.close()

    def stop(self) -> None:
        self._server.stop()


def make_server(
    home: Path,
    host: str = "127.0.0.1",
    port: int = 8765,
    socket_path: Path | None = None,
    read_only: bool = False,
    allow_hosts: Sequence[str] = (),
    limits: Limits | None = None,
) -> Served:
    """A bound server, not yet serving (port 0: any free port; the real one is in the URL)."""
    limits, backlog = _fitting(limits or Limits())
    token = auth.load_or_create_token(ensure_private_dir(home))
    if socket_path is not None:
        listener = listen_unix(socket_path, backlog)
    else:
        listener = listen_tcp(host, port, backlog)
    allowed = auth.allowed_hosts([listener.url_host], listener.port, allow_hosts)
    app = App(home, token, allowed, read_only, limits)
    dashboard = Dashboard(app)
    route_library_logs()
    config = uvicorn.Config(
        dashboard,
        loop="asyncio",
        http=protocol_for(limits),
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # nobody in front of us is trusted to say who the client is
        server_header=False,
        date_header=False,
        timeout_keep_alive=limits.keep_alive_s,
        timeout_graceful_shutdown=SHUTDOWN_S,
        h11_max_incomplete_event_size=limits.max_head_bytes,
        backlog=backlog,
    )
    return Served(app, listener, dashboard, _Uvicorn(config, app))


def _fitting(limits: Limits) -> tuple[Limits, int]:
    """The connection cap, and the accept backlog, that fit under the file-descriptor limit with room
    for BURSTS bursts of accepts: a connection past the limit would fail in accept(), where nobody can
    be made room for. (1024 open files: a backlog of 64 and 704 connections.)"""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits, BACKLOG
    backlog = max(4, min(BACKLOG, soft // 16))
    room = max(8, soft - RESERVED_FDS - BURSTS * backlog)
    return dataclasses.replace(limits, max_connections=min(limits.max_connections, room)), backlog


class _StopOnSignal:
    """SIGTERM/SIGINT handler, installed before the server exists: a signal then is remembered."""

    def __init__(self) -> None:
        self.served: Served | None = None
        self.requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self.served is not None:
            self.served.stop()


def serve(
    home: Path,
    host: str,
    port: int,
    socket_path: Path | None,
    read_only: bool,
    allow_hosts: Sequence[str],
) -> int:
    """The command: print the URL (first line of stdout), then serve until Ctrl-C or SIGTERM."""
    on_signal = _StopOnSignal()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    _raise_file_limit()
    served = on_signal.served = make_server(home, host, port, socket_path, read_only, allow_hosts)
    if on_signal.requested:
        served.stop()
    print(served.url, flush=True)
    if not served.listener.loopback:
        print(
            f"jobwarden web: WARNING: serving on {host}, not loopback: anyone who can reach this machine "
            "can try the token; prefer an SSH tunnel (ssh -L 8765:127.0.0.1:8765 HOST) or --socket",
            file=sys.stderr,
            flush=True,
        )
    if socket_path is not None:
        print(
            f"jobwarden web: on the Unix socket {socket_path} (0600); from another machine: "
            f"ssh -L 8765:{socket_path} HOST, then http://localhost:8765/?token=…",
            file=sys.stderr,
            flush=True,
        )
    try:
        served.run()
    finally:
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)
    return 0


def _raise_file_limit() -> None:
    """Room for `Limits.max_connections`: the soft limit up to what the hard limit allows (the default
    soft limit, 1024 on many systems, is what the cap would otherwise be cut to)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = Limits().max_connections + RESERVED_FDS + BURSTS * BACKLOG
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))

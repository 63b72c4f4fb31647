"""`jobwarden web`: a dashboard and a JSON API over the same views the CLI prints (stdlib only).

Safe by default: it listens on 127.0.0.1, every request needs the token from JOBWARDEN_HOME/web.token
(printed in the URL), the Host header must be one of ours, and a change of a job needs more still
(`auth`). It never serves a job's environment.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NamedTuple

from jobwarden.errors import UsageError
from jobwarden.paths import ensure_private_dir
from jobwarden.web import auth
from jobwarden.web.app import App
from jobwarden.web.server import TCPServer, UnixServer, clear_stale_socket, handler_for

__all__ = ["Served", "make_server", "serve"]


class Served(NamedTuple):
    server: TCPServer | UnixServer
    app: App
    url: str  # with the token


def make_server(
    home: Path,
    host: str = "127.0.0.1",
    port: int = 8765,
    socket_path: Path | None = None,
    read_only: bool = False,
    allow_hosts: Sequence[str] = (),
) -> Served:
    """A bound server, not yet serving (port 0: any free port, the real one is in the URL)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port: {port} is not a port number", "use 1-65535, or 0 for any free port")
    token = auth.load_or_create_token(ensure_private_dir(home))
    app = App(home, token, frozenset(), read_only)
    handler = handler_for(app)
    server: TCPServer | UnixServer
    try:
        if socket_path is not None:
            clear_stale_socket(socket_path)
            server = UnixServer(str(socket_path), handler)
            app.allowed_hosts = auth.allowed_hosts(None, None, allow_hosts)
            return Served(server, app, f"http://localhost/?token={token}")
        server = TCPServer((host, port), handler)
    except OSError as err:
        where = socket_path or f"{host}:{port}"
        remedy = "choose another --port or --host"
        raise UsageError(f"cannot serve on {where}: {err.strerror}", remedy) from err
    real_port = int(server.server_address[1])
    app.allowed_hosts = auth.allowed_hosts(host, real_port, allow_hosts)
    shown = f"[{host}]" if ":" in host else ("127.0.0.1" if host in ("0.0.0.0", "") else host)
    return Served(server, app, f"http://{shown}:{real_port}/?token={token}")


def serve(
    home: Path,
    host: str,
    port: int,
    socket_path: Path | None,
    read_only: bool,
    allow_hosts: Sequence[str],
) -> int:
    """The command: print the URL (first line of stdout), then serve until Ctrl-C or SIGTERM."""
    loopback = socket_path is not None or auth.check_bind_host(host)
    served = make_server(home, host, port, socket_path, read_only, allow_hosts)
    print(served.url, flush=True)
    if not loopback:
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
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        served.server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        served.app.stopping.set()  # open log streams end at their next poll
        served.server.server_close()
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)
    return 0


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt

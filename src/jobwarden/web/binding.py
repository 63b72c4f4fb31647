"""Where `jobwarden web` listens, and the address it prints, which must open as printed.

`--host` is resolved as the kernel would bind it (`0` is 0.0.0.0, `127.1` is 127.0.0.1, `::` is every
IPv6 and, with the default bindv6only=0, IPv4 address too), and the printed address names what the
browser must send as Host: a wildcard is reached through loopback (`127.0.0.1`, or `[::1]` for an IPv6
wildcard), a numeric address in its canonical form, a name as given; port 80 is left out, as browsers
leave it out of Host. A Unix socket's path must fit `sun_path` (108 bytes with its terminating NUL, unix(7)).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from pathlib import Path
from typing import NamedTuple

from jobwarden.errors import UsageError

BACKLOG = 64  # connections the kernel queues for accept() (server.py may ask for fewer)
MAX_SOCKET_PATH = 107  # bytes: sun_path is 108 with the terminating NUL


class Listener(NamedTuple):
    sock: socket.socket
    url_host: str  # how the printed address names the server: 127.0.0.1, [::1], localhost, gpu-box
    port: int | None  # None: a Unix socket
    loopback: bool  # only this machine can connect (a Unix socket: only this user)

    def url(self, token: str) -> str:
        port = "" if self.port in (None, 80) else f":{self.port}"
        return f"http://{self.url_host}{port}/?token={token}"


def listen_tcp(host: str, port: int, backlog: int = BACKLOG) -> Listener:
    if not 0 <= port <= 65535:
        raise UsageError(f"--port: {port} is not a port number", "use 1-65535, or 0 for any free port")
    if not host.strip():
        raise UsageError("--host: empty address", "leave it out to serve on 127.0.0.1")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as err:
        reason = err.strerror if isinstance(err, socket.gaierror) else "not a host name"
        remedy = "give an address of this machine (127.0.0.1, ::1) or one of its names"
        raise UsageError(f"--host: cannot resolve {host!r}: {reason}", remedy) from None
    sock = None
    try:
        sock = socket.socket(family, kind, proto)  # fails for IPv6 on a machine without it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as err:
        if sock is not None:
            sock.close()
        remedy = "choose another --port or --host"
        if port and port < 1024 and isinstance(err, PermissionError):
            remedy = "ports below 1024 need root (or CAP_NET_BIND_SERVICE): use --port 8765"
        raise UsageError(f"cannot serve on {host}:{port}: {err.strerror}", remedy) from None
    bound = ipaddress.ip_address(sock.getsockname()[0].partition("%")[0])
    return Listener(sock, _url_host(host, bound), int(sock.getsockname()[1]), bound.is_loopback)


def _url_host(host: str, bound: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if bound.is_unspecified:  # every address: this machine reaches it through loopback
        return "127.0.0.1" if bound.version == 4 else "[::1]"
    if not _is_numeric(host):
        return host.lower()  # a name, which the Host header then carries
    return str(bound) if bound.version == 4 else f"[{bound}]"


def _is_numeric(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def listen_unix(path: Path, backlog: int = BACKLOG) -> Listener:
    """A socket only this user can connect to: created 0600 from the start (umask), not chmod-ed after,
    so there is no moment when others may connect."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise UsageError(
            f"--socket: {path} is {size} bytes long; a Unix socket's path can have at most "
            f"{MAX_SOCKET_PATH} (sun_path holds 108 bytes with the final NUL)",
            "choose a shorter path, e.g. in /tmp or $XDG_RUNTIME_DIR",
        )
    clear_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(os.fsencode(path))
        sock.listen(backlog)
    except OSError as err:
        sock.close()
        raise UsageError(f"cannot serve on {path}: {err.strerror}", "choose another --socket path") from None
    finally:
        os.umask(old)
    return Listener(sock, "localhost", None, True)


def clear_stale_socket(path: Path) -> None:
    """A socket file left by a server that died may be replaced; one that answers, or any other file,
    may not."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise UsageError(f"--socket: cannot use {path}: {err.strerror}", "choose another path") from None
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"--socket: {path} exists and is not a socket", "choose another path")
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(os.fsencode(path))
        except OSError:
            path.unlink()
            return
    raise UsageError(f"--socket: another server is listening on {path}", "stop it, or choose another path")

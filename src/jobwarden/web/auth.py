"""Who may talk to the dashboard: the token, the Host allow-list and the checks on a state change.

Loopback is no boundary on a shared GPU server (every local user can connect) and a browser can be steered
to localhost by any web page (CSRF; DNS rebinding reads the answers). So: a token on every request, the
Host header checked before anything else (a rebinding attacker's Host is their own domain), and a POST
only with the token, a header no cross-origin form can set, and our own Origin or none. A browser holds
a session cookie instead of the token (web/sessions.py).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from jobwarden.errors import UsageError
from jobwarden.osapi.sharedfiles import Refused, SharedDir, Trust, write_private
from jobwarden.web.messages import Headers

TOKEN_FILE = "web.token"
CSRF_HEADER = "X-Jobwarden"
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43,256}")  # what secrets.token_urlsafe(32) makes, and room to spare
_MAX_TOKEN_FILE = 1024
_HTTP_PORT = "80"  # a browser leaves it out of Host and Origin


def load_or_create_token(home: Path) -> str:
    """The token kept in JOBWARDEN_HOME (0600), made on first use: a restart keeps the browser's session
    and a Prometheus `credentials_file` valid. A file that cannot hold a secret (another owner, readable
    by others, not a token) is replaced; something that is not a file at all is refused, never read."""
    path = home / TOKEN_FILE
    try:
        with SharedDir.open(home, Trust(secret=True)) as folder:
            token = folder.read_bytes(TOKEN_FILE, _MAX_TOKEN_FILE).decode("ascii", errors="replace").strip()
        if _TOKEN.fullmatch(token):
            return token
    except FileNotFoundError:
        pass
    except Refused as err:
        if err.not_a_file or err.path != path:  # not a file at all, or the home itself is not to be trusted
            raise UsageError(
                f"{err}: not taken as the web token",
                f"remove it (rm -r {err.path}); jobwarden web then makes a new token",
            ) from None
        # a regular file that holds no secret of ours (another owner, others may read it, too large): replaced
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}", f"remove it (rm {path})") from None
    token = secrets.token_urlsafe(32)  # 32 random bytes
    try:
        write_private(path, f"{token}\n".encode())
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}", f"remove it (rm -r {path})") from None
    return token


def allowed_hosts(names: Iterable[str], port: int | None, extra: Iterable[str]) -> frozenset[str]:
    """Host header values the server answers, each as `name:port`: the loopback names and `names` (how
    the printed address names us) with our port; `port` None (a Unix socket, reached through a tunnel
    whose local port we cannot know): with any port (`name:*`). `--allow-host` names without a port
    take any port."""
    hosts = {f"{name.lower()}:{port if port is not None else '*'}" for name in (*_LOOPBACK_NAMES, *names)}
    for host in extra:
        host = host.strip().lower()
        hosts.add(host if _port_of(host) is not None else f"{host}:*")
    return frozenset(hosts)


def _port_of(host: str) -> str | None:
    name, colon, port = host.rpartition(":")
    if colon and port.isascii() and port.isdigit() and not name.endswith(":"):
        return port
    return None


def _normal(host: str) -> tuple[str, str]:
    """(name, port) of a Host header value or an origin's authority, the port 80 when none is given."""
    host = host.strip().lower()
    port = _port_of(host)
    return (host.rpartition(":")[0], port) if port is not None else (host, _HTTP_PORT)


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    if not host_header:
        return False
    name, port = _normal(host_header)
    return f"{name}:{port}" in allowed or f"{name}:*" in allowed


class Presented(NamedTuple):
    """What a request offers as proof, in the order it is believed: what the request names itself (the
    header, then the address: the printed URL always wins over a cookie left from earlier), then the
    session cookie."""

    how: str  # "header", "query", "cookie" or "" (nothing)
    value: str


def presented(headers: Headers, query: dict[str, str]) -> Presented:
    scheme, _, value = (headers.get("Authorization") or "").strip().partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return Presented("header", value.strip())
    if "token" in query:
        return Presented("query", query["token"])
    if headers.get("Cookie"):
        return Presented("cookie", headers.get("Cookie") or "")
    return Presented("", "")


def token_ok(presented: str | None, token: str) -> bool:
    """Constant-time, and for any text: a non-ASCII value is compared as its UTF-8 bytes."""
    return presented is not None and secrets.compare_digest(presented.encode(), token.encode())


def post_refusal(headers: Headers) -> str | None:
    """Why a state-changing request must be refused (after the token was checked), or None.
    SameSite=Strict alone does not stop another local port's page: ports do not make another site."""
    if headers.get(CSRF_HEADER) != "1":
        return f"a request that changes a job needs the header {CSRF_HEADER}: 1"
    origin = headers.get("Origin")
    if origin is not None and not _same_origin(origin, headers.get("Host") or ""):
        return f"a request from another origin ({origin[:100]}) may not change a job"
    return None


def _same_origin(origin: str, host: str) -> bool:
    scheme, sep, authority = origin.partition("://")
    return sep == "://" and scheme.lower() == "http" and bool(host) and _normal(authority) == _normal(host)

"""Who may talk to the dashboard: the token, the Host allow-list and the checks on a state change.

Loopback is no boundary on a shared GPU server (every local user can connect) and a browser can be steered
to localhost by any web page (CSRF; DNS rebinding reads the answers). So: a token on every request, the
Host header checked before anything else (a rebinding attacker's Host is their own domain), and a POST
only with the token, a header no cross-origin form can set, and our own Origin or none.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from email.message import Message
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from urllib.parse import parse_qs

from jobwarden.errors import UsageError

TOKEN_FILE = "web.token"
COOKIE = "jobwarden_token"
CSRF_HEADER = "X-Jobwarden"
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def load_or_create_token(home: Path) -> str:
    """The token kept in JOBWARDEN_HOME (0600), made on first use: a restart keeps the browser's cookie
    and a Prometheus `credentials_file` valid. A file others could read is replaced, never trusted."""
    path = home / TOKEN_FILE
    with contextlib.suppress(FileNotFoundError):
        st = path.stat()
        token = path.read_text().strip()
        if st.st_uid == os.getuid() and not st.st_mode & 0o077 and len(token) >= 43:
            return token
    token = secrets.token_urlsafe(32)  # 32 random bytes
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{token}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def allowed_hosts(bind_host: str | None, port: int | None, extra: Iterable[str]) -> frozenset[str]:
    """Host header values the server answers. `port` None (a Unix socket, reached through a tunnel whose
    local port we cannot know): the loopback names with any port."""
    names = set(_LOOPBACK_NAMES)
    if bind_host and bind_host not in ("0.0.0.0", "::", ""):
        names.add(f"[{bind_host}]" if ":" in bind_host else bind_host)
    hosts = set()
    for name in names:
        hosts.add(f"{name}:{port}" if port is not None else f"{name}:*")
    for host in extra:
        hosts.add(host if _has_port(host) else f"{host}:*")
    return frozenset(hosts)


def _has_port(host: str) -> bool:
    return host.rpartition(":")[2].isdigit() and not host.endswith("]")


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host in allowed:
        return True
    name = host.rpartition(":")[0] if _has_port(host) else host
    return f"{name}:*" in allowed


def token_in_query(query: str) -> str | None:
    values = parse_qs(query).get("token")
    return values[0] if values else None


def presented_token(headers: Message, query: str) -> str | None:
    """The token a request carries: `Authorization: token T` or `Bearer T`, the cookie, or `?token=`."""
    auth = headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    cookie = _cookie_token(headers.get("Cookie", ""))
    return cookie if cookie is not None else token_in_query(query)


def _cookie_token(header: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


def token_ok(presented: str | None, token: str) -> bool:
    return presented is not None and secrets.compare_digest(presented.encode(), token.encode())


def cookie_header(token: str) -> str:
    """Set-Cookie after `?token=`: HttpOnly (no script reads it), SameSite=Strict, the whole site."""
    return f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"


def post_refusal(headers: Message) -> str | None:
    """Why a state-changing request must be refused (after the token was checked), or None.
    SameSite=Strict alone does not stop another local port's page: ports do not make another site."""
    if headers.get(CSRF_HEADER) != "1":
        return f"a request that changes a job needs the header {CSRF_HEADER}: 1"
    origin = headers.get("Origin")
    if origin is not None and origin != f"http://{headers.get('Host', '')}":
        return f"a request from another origin ({origin}) may not change a job"
    return None


def check_bind_host(host: str) -> bool:
    """True when `host` is loopback; anything else deserves the user's attention."""
    if host in ("127.0.0.1", "::1", "localhost"):
        return True
    if not host:
        raise UsageError("--host: empty address", "leave it out to serve on 127.0.0.1")
    return host.startswith("127.")

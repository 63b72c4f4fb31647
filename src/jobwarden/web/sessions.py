"""The browser's session: a cookie that is not the token, named per server, read tolerantly.

Browsers keep cookies per host name, not per port (RFC 6265 §8.5): every server on 127.0.0.1 receives
every cookie of 127.0.0.1. So the cookie must be worth nothing elsewhere. It once was the token itself: a
plain server on another local port received it and could use it as a Bearer token here. Now:

- its value is a session, `ISSUED.MAC`: an HMAC, under a key derived from the token, of the cookie's name
  and the time it was issued. It never reveals the token and no API takes it as one; it is valid here for
  `SESSION_S` after it was issued, and a page in use gets a fresh one every `REFRESH_S`;
- its name carries the port the browser used and a tag derived from the token, so two dashboards on one
  host (two users, or two machines behind two tunnels) never overwrite each other's;
- it is set only after the token was verified (`?token=` on a page), HttpOnly, SameSite=Strict;
- the Cookie header is read pair by pair, the way browsers write it: a cookie of another local app that
  `http.cookies` cannot parse once made every request 401 (SimpleCookie gives up on the whole header).

A session cookie taken from the browser by another local server still opens this dashboard until it
expires, as a cookie of any local web app would (Jupyter's included); the token never leaves the address
bar, the `Authorization` header and `web.token`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

SESSION_S = 24 * 3600  # a session unused for this long has expired
REFRESH_S = 3600  # a page in use gets a new session this often, so it never expires while open
CLOCK_SKEW_S = 60  # a session issued "in the future" by this much is still taken (a clock step)
_MAC_BYTES = 18  # 144 bits, 24 base64 characters
_VALUE = re.compile(r"([0-9]{1,12})\.([A-Za-z0-9_-]{24})")
_PORT = re.compile(r":([0-9]{1,5})$")


def parse_cookies(header: str) -> list[tuple[str, str]]:
    """Every `name=value` pair of a Cookie header, in the order sent (RFC 6265 §5.4). A piece that is not
    one (no '=', an empty name) is skipped, never an error; a value in double quotes loses them."""
    pairs = []
    for piece in header.split(";"):
        name, eq, value = piece.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name:
            continue
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        pairs.append((name, value))
    return pairs


class Sessions:
    """Issues and checks this server's session cookies. Derived from the token alone, so a restarted
    server (same `web.token`) keeps the browser's session, and a new token ends every session."""

    def __init__(self, token: str) -> None:
        secret = token.encode()
        self._key = hmac.new(secret, b"jobwarden web: session key", hashlib.sha256).digest()
        self.tag = hmac.new(secret, b"jobwarden web: cookie name", hashlib.sha256).hexdigest()[:8]

    def cookie_name(self, host: str | None) -> str:
        """`jobwarden-PORT-TAG`, PORT as the browser addressed us (its Host header: 80 when it names
        none; a tunnel's local port may differ from ours)."""
        found = _PORT.search(host or "")
        return f"jobwarden-{found.group(1) if found else '80'}-{self.tag}"

    def issue(self, name: str, now: float) -> str:
        issued = str(int(now))
        return f"{issued}.{self._mac(name, issued)}"

    def age(self, cookie_header: str, name: str, now: float) -> float | None:
        """The age of the youngest valid session among the cookies called `name` (a browser may hold
        several: one per path), None when none is valid."""
        ages = []
        for got, value in parse_cookies(cookie_header):
            match = _VALUE.fullmatch(value) if got == name else None
            if match is None:
                continue
            issued, mac = match.groups()
            age = now - int(issued)
            if -CLOCK_SKEW_S <= age <= SESSION_S and hmac.compare_digest(mac, self._mac(name, issued)):
                ages.append(age)
        return min(ages, default=None)

    def set_cookie(self, name: str, value: str) -> str:
        """The Set-Cookie header: no script may read it, no other site's page sends it, and the browser
        drops it when the session would have expired anyway."""
        return f"{name}={value}; Max-Age={SESSION_S}; Path=/; HttpOnly; SameSite=Strict"

    def _mac(self, name: str, issued: str) -> str:
        digest = hmac.new(self._key, f"{name}\n{issued}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:_MAC_BYTES]).decode()

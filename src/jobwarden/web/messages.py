"""The small vocabulary the endpoints speak: a parsed request, a response, and an error with its status.
None of it knows the HTTP server underneath (web/asgi.py translates)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from jobwarden.web import params

API_HEADERS = {"Cache-Control": "no-store"}


class HTTPProblem(Exception):
    """An answer other than success, with the message the client sees (never a traceback)."""

    def __init__(self, status: int, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.remedy = status, message, remedy


class Headers:
    """A request's headers: names in any case; values as sent, bytes read as Latin-1 (HTTP allows any
    byte from 0x80 up in a value, RFC 9110 §5.5); a repeated header's values joined, as RFC 9110 §5.3
    allows (Cookie's with '; ', RFC 6265 §5.4)."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        joined: dict[str, str] = {}
        for name, value in pairs:
            key = name.lower()
            if key in joined:
                value = f"{joined[key]}{'; ' if key == 'cookie' else ', '}{value}"
            joined[key] = value
        self._values = joined

    @classmethod
    def of(cls, values: Mapping[str, str]) -> Headers:
        return cls(values.items())

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._values


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # as sent: still percent-encoded, without the query
    query_string: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""

    @cached_property
    def query(self) -> dict[str, str]:
        """Each parameter's first value; a query that cannot be read is the client's error."""
        try:
            return params.parse_query(self.query_string)
        except params.BadParameter as err:
            raise HTTPProblem(400, str(err)) from None

    def param(self, name: str) -> str | None:
        return self.query.get(name)

    def int_param(self, name: str, minimum: int = 0, maximum: int = params.MAX_WHOLE) -> int | None:
        """A whole-number query parameter (absent or empty: None); a bad one is the client's error, named."""
        text = self.param(name)
        if not text:
            return None
        try:
            return params.whole_number(name, text, minimum, maximum)
        except params.BadParameter as err:
            raise HTTPProblem(400, str(err)) from None

    def float_param(self, name: str, minimum: float = 0.0, maximum: float = 1e15) -> float | None:
        """A decimal query parameter, finite and within bounds (absent or empty: None)."""
        text = self.param(name)
        if not text:
            return None
        try:
            return params.finite_number(name, text, minimum, maximum)
        except params.BadParameter as err:
            raise HTTPProblem(400, str(err)) from None


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    file: Path | None = None  # sent after the body, in pieces: a whole log may be gigabytes


def json_response(obj: Any, status: int = 200) -> Response:
    # compact: with an indent CPython falls back to its pure-Python encoder, 10,000 jobs cost ~100 ms more
    body = json.dumps(obj, separators=(",", ":")).encode()
    return Response(status, body, "application/json", dict(API_HEADERS))


def text_response(text: str | bytes, status: int = 200, content_type: str = "text/plain") -> Response:
    body = text.encode() if isinstance(text, str) else text
    return Response(status, body, f"{content_type}; charset=utf-8", dict(API_HEADERS))


def error_json(status: int, message: str, remedy: str = "") -> Response:
    return json_response({"error": message, "remedy": remedy or None}, status)

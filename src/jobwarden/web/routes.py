"""Which address does what. /api/v1 names are a contract (docs/architecture.md): extend, never rename."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import unquote

from jobwarden.web import api, logview, pages


class Route(NamedTuple):
    method: str
    pattern: re.Pattern[str]
    handler: Callable[..., Any]
    kind: str  # "page" (HTML), "api" (JSON/text), "asset", "stream" (SSE), "open" (no token needed)
    changes_jobs: bool = False


def _route(method: str, path: str, handler: Callable[..., Any], kind: str = "api") -> Route:
    return Route(method, re.compile(f"^{path}$"), handler, kind, method == "POST")


_JOB = "/api/v1/jobs/([^/]+)"
ROUTES: list[Route] = [
    _route("GET", "/", pages.job_list, "page"),
    _route("GET", "/jobs/([^/]+)", pages.job_page, "page"),
    _route("GET", "/static/(.+)", pages.asset, "asset"),
    _route("GET", "/healthz", api.healthz, "open"),
    _route("GET", "/metrics", api.metrics),
    _route("GET", "/api/v1/jobs", api.jobs),
    _route("GET", _JOB, api.status),
    _route("GET", f"{_JOB}/explain", api.explain),
    _route("GET", f"{_JOB}/samples", api.samples),
    _route("GET", f"{_JOB}/stacks", api.stacks),
    _route("GET", f"{_JOB}/log", logview.log),
    _route("GET", f"{_JOB}/log/stream", logview.stream, "stream"),  # the server writes it as it goes
    _route("POST", f"{_JOB}/stop", api.stop),
    _route("POST", f"{_JOB}/dump", api.dump),
]


class Match(NamedTuple):
    route: Route
    args: tuple[str, ...]


def match(method: str, path: str) -> Match | str | None:
    """The route and its path arguments (unquoted); "method" when the path exists for another method;
    None when nothing lives there."""
    other_method = False
    for route in ROUTES:
        m = route.pattern.match(path)
        if m is None:
            continue
        if route.method == method:
            return Match(route, tuple(unquote(g) for g in m.groups()))
        other_method = True
    return "method" if other_method else None

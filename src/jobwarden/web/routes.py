"""Which address does what. /api/v1 names are a contract (docs/architecture.md): extend, never rename.

A route is one line: method, path pattern, handler, kind. The kind decides what the gate (web/gate.py)
asks of a request before the handler runs; `any_host=True` skips even the Host check, for a probe that
names the server by an address no allow-list knows (a kubelet's probe names the pod's IP)."""

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
    any_host: bool = False  # answered whatever the Host header says (only for an "open" route)


def _route(
    method: str, path: str, handler: Callable[..., Any], kind: str = "api", any_host: bool = False
) -> Route:
    if any_host and kind != "open":
        raise ValueError(f"{path}: a route that needs the token needs our Host too")
    return Route(method, re.compile(f"^{path}$"), handler, kind, method == "POST", any_host)


_JOB = "/api/v1/jobs/([^/]+)"
ROUTES: list[Route] = [
    _route("GET", "/", pages.job_list, "page"),
    _route("GET", "/jobs/([^/]+)", pages.job_page, "page"),
    _route("GET", "/jobs/([^/]+)/log", pages.log_page, "page"),
    _route("GET", "/favicon.ico", pages.favicon, "asset"),
    _route("GET", "/static/(.+)", pages.asset, "asset"),
    _route("GET", "/healthz", api.healthz, "open", any_host=True),  # a container's liveness probe
    _route("GET", "/metrics", api.metrics),
    _route("GET", "/api/v1/server", api.server),
    _route("GET", "/api/v1/jobs", api.jobs),
    _route("GET", _JOB, api.status),
    _route("GET", f"{_JOB}/explain", api.explain),
    _route("GET", f"{_JOB}/samples", api.samples),
    _route("GET", f"{_JOB}/stacks", api.stacks),
    _route("GET", f"{_JOB}/profile", api.profile),
    _route("GET", f"{_JOB}/diff", api.changes),  # what changed since its command last succeeded
    _route("GET", f"{_JOB}/log", logview.log),
    _route("GET", f"{_JOB}/log/stream", logview.follower, "stream"),  # the server writes it as it goes
    _route("POST", f"{_JOB}/stop", api.stop),
    _route("POST", f"{_JOB}/dump", api.dump),
    _route("POST", f"{_JOB}/rerun", api.rerun),
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

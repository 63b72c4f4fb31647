"""The pages: static HTML shells and the script and style files they load, all package data read with
importlib.resources. The only job-provided text a page carries is escaped here; the scripts fill in the
rest with textContent. No inline script anywhere: the policy is `default-src 'self'`."""

from __future__ import annotations

import html
import re
from importlib import resources
from importlib.resources.abc import Traversable

from jobwarden.web.app import App
from jobwarden.web.messages import HTTPProblem, Request, Response

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}
_STATIC_NAME = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*(\.[A-Za-z0-9_-]+)*\.(js|css|svg)$")
_PAGE_HEADERS = {"Cache-Control": "no-store"}
_ASSET_HEADERS = {"Cache-Control": "private, max-age=300"}


def _static() -> Traversable:
    return resources.files("jobwarden.web") / "static"


def _read(name: str) -> bytes:
    return (_static() / name).read_bytes()


def job_list(app: App, req: Request) -> Response:
    return Response(200, _read("list.html"), _TYPES[".html"], dict(_PAGE_HEADERS))


def job_page(app: App, req: Request, ref: str) -> Response:
    return _job_shell(app, "job.html", ref)


def log_page(app: App, req: Request, ref: str) -> Response:
    """The whole log, coloured and searchable (static/log.js reads it by offset)."""
    return _job_shell(app, "log.html", ref)


def favicon(app: App, req: Request) -> Response:
    """What a browser asks for by itself: our icon, from here (no page loads anything from elsewhere)."""
    return Response(200, _read("favicon.svg"), _TYPES[".svg"], dict(_ASSET_HEADERS))


def _job_shell(app: App, name: str, ref: str) -> Response:
    from jobwarden.control.jobs import find_job

    job = find_job(app.home, ref)  # an unknown job: 404 before any page is drawn
    page = _read(name).decode()
    page = page.replace("{{JOB_ID}}", str(job.id)).replace("{{JOB_NAME}}", html.escape(job.name))
    return Response(200, page.encode(), _TYPES[".html"], dict(_PAGE_HEADERS))


def asset(app: App, req: Request, name: str) -> Response:
    """A script or style sheet from static/ (its name checked: no way out of the folder)."""
    if not _STATIC_NAME.match(name):
        raise HTTPProblem(404, f"no file {name!r}")
    path = _static().joinpath(*name.split("/"))
    if not path.is_file():
        raise HTTPProblem(404, f"no file {name!r}")
    suffix = name[name.rfind(".") :]
    return Response(200, path.read_bytes(), _TYPES[suffix], dict(_ASSET_HEADERS))

"""The checks every request passes before a handler runs, in a fixed order, whatever server carries it:

1. the Host header (DNS rebinding), before anything else, unless the route answers any Host;
2. the method and the route (501, 405, 404);
3. the token, for every route but the open ones: the `Authorization` header, else `?token=`, else the
   session cookie (web/sessions.py). What a request names itself wins: a wrong header or `?token=` is
   401 even beside a good cookie, and a good `?token=` beats a stale cookie;
4. a page opened with a good `?token=`: a new session cookie and a redirect to the same page without the
   token, so that it leaves the address bar and the history;
5. for a change of a job: not `--read-only`, the header `X-Jobwarden: 1` and our own Origin (CSRF).

Adding a route is one line in web/routes.py; its kind says which of these apply.
"""

from __future__ import annotations

import time
from typing import NamedTuple
from urllib.parse import urlencode

from jobwarden.web import auth, routes
from jobwarden.web.app import App
from jobwarden.web.messages import HTTPProblem, Request, Response, error_json, text_response
from jobwarden.web.sessions import REFRESH_S

METHODS = ("GET", "POST")


class Admitted(NamedTuple):
    route: routes.Route
    args: tuple[str, ...]
    set_cookie: str | None  # a renewed session for the answer, or None


def admit(app: App, req: Request) -> Admitted | Response:
    """The route to run, or the answer that ends the request here; HTTPProblem for a refusal."""
    found = routes.match(req.method, req.path)
    any_host = isinstance(found, routes.Match) and found.route.any_host
    if not any_host and not auth.host_allowed(req.headers.get("Host"), app.allowed_hosts):
        raise HTTPProblem(403, "this Host is not allowed", "use --allow-host NAME to serve it")
    if req.method not in METHODS:
        raise HTTPProblem(501, f"{req.method[:20]} is not implemented")
    if found == "method":
        raise HTTPProblem(405, f"{req.method} is not allowed here")
    if not isinstance(found, routes.Match):
        raise HTTPProblem(404, f"nothing at {req.path[:200]}")
    route, set_cookie = found.route, None
    if route.kind != "open":
        proof = auth.presented(req.headers, req.query)
        session_age = _verified(app, req, proof)
        if session_age is None:
            return _unauthorized(route.kind)
        if proof.how == "query" and route.kind == "page":
            return _session_and_redirect(app, req)
        if proof.how == "cookie" and session_age >= REFRESH_S:
            set_cookie = _new_session(app, req)
    if route.changes_jobs:
        if app.read_only:
            raise HTTPProblem(403, "this server is read-only (--read-only): nothing can be changed")
        refusal = auth.post_refusal(req.headers)
        if refusal:
            raise HTTPProblem(403, refusal)
    return Admitted(route, found.args, set_cookie)


def _verified(app: App, req: Request, proof: auth.Presented) -> float | None:
    """0 for the token itself, the session's age for a good session cookie, None when neither."""
    if proof.how == "cookie":
        name = app.sessions.cookie_name(req.headers.get("Host"))
        return app.sessions.age(proof.value, name, time.time())
    return 0.0 if proof.how and auth.token_ok(proof.value, app.token) else None


def _new_session(app: App, req: Request) -> str:
    name = app.sessions.cookie_name(req.headers.get("Host"))
    return app.sessions.set_cookie(name, app.sessions.issue(name, time.time()))


def _session_and_redirect(app: App, req: Request) -> Response:
    rest = urlencode([(k, v) for k, v in req.query.items() if k != "token"])
    headers = {"Location": req.path + (f"?{rest}" if rest else ""), "Set-Cookie": _new_session(app, req)}
    return Response(303, b"", "text/plain; charset=utf-8", {"Cache-Control": "no-store", **headers})


def _unauthorized(kind: str) -> Response:
    if kind == "page":
        text = "jobwarden web: open the address `jobwarden web` printed (it carries the token)\n"
        response = text_response(text, 401)
    else:
        response = error_json(401, "a token is needed: ?token=T, or the header Authorization: token T")
    response.headers["WWW-Authenticate"] = 'Bearer realm="jobwarden"'
    return response

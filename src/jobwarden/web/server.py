"""`jobwarden web`: the stdlib's threading HTTP server (a thread per connection, daemon threads), a gate
every request passes in a fixed order (Host, token, then for a change of a job its CSRF checks), and one
error funnel: the client gets JSON with a message, the server's log one line, nobody a traceback."""

from __future__ import annotations

import os
import re
import socket
import socketserver
import stat
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from jobwarden.errors import JobNotFound, JobwardenError, StoreError, UsageError
from jobwarden.web import auth, logview, routes
from jobwarden.web.app import App
from jobwarden.web.messages import HTTPProblem, Request, Response, error_json, text_response

MAX_BODY = 64 << 10
_SECURITY_HEADERS = {
    # no inline script or style: the pages load their own files only
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_TOKEN_IN_TEXT = re.compile(r"token=[^&\s'\"]*")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "jobwarden"
    sys_version = ""
    app: App  # set on the subclass the server makes
    # what the base class answers by itself (a method it has no do_X for, a request it cannot parse)
    error_content_type = "application/json"
    error_message_format = '{"error": "%(code)d %(message)s", "remedy": null}\n'

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def version_string(self) -> str:
        return self.server_version  # no Python version on the wire

    def address_string(self) -> str:
        # on a Unix socket client_address is '' and the base class's [0] raises IndexError
        return self.client_address[0] if isinstance(self.client_address, tuple) else "unix"

    def log_message(self, format: str, *args: Any) -> None:
        self.app.log_error(_TOKEN_IN_TEXT.sub("token=…", format % args))

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # errors are logged once, with their reason, by _handle

    # --- one request ------------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        split = urlsplit(self.path)
        try:
            req = Request(method, split.path, split.query, self.headers, self._body(method))
            response = self._answer(req)
        except Exception as err:  # the funnel: every failure becomes an answer and one log line
            response = self._failure(err, method, split.path)
        if response is not None:
            self._send(response)

    def _body(self, method: str) -> bytes:
        if method != "POST":
            return b""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise HTTPProblem(400, "Content-Length is not a number") from None
        if length > MAX_BODY:
            raise HTTPProblem(413, f"the request body is over {MAX_BODY} bytes")
        return self.rfile.read(length) if length > 0 else b""

    def _answer(self, req: Request) -> Response | None:
        app = self.app
        if not auth.host_allowed(req.headers.get("Host"), app.allowed_hosts):
            raise HTTPProblem(403, "this Host is not allowed", "use --allow-host NAME to serve it")
        found = routes.match(req.method, req.path)
        if found == "method":
            raise HTTPProblem(405, f"{req.method} is not allowed here")
        if not isinstance(found, routes.Match):
            raise HTTPProblem(404, f"nothing at {req.path}")
        route = found.route
        if route.kind != "open":
            if not auth.token_ok(auth.presented_token(req.headers, req.query_string), app.token):
                return _unauthorized(route.kind)
            if route.kind == "page" and auth.token_in_query(req.query_string) is not None:
                return _drop_token_from_address(req)
        if route.changes_jobs:
            if app.read_only:
                raise HTTPProblem(403, "this server is read-only (--read-only): nothing can be changed")
            refusal = auth.post_refusal(req.headers)
            if refusal:
                raise HTTPProblem(403, refusal)
        if route.kind == "stream":
            self._stream(req, found.args[0])
            return None
        response: Response = route.handler(app, req, *found.args)
        return response

    def _failure(self, err: Exception, method: str, path: str) -> Response:
        status, remedy = 500, ""
        if isinstance(err, HTTPProblem):
            status, message, remedy = err.status, err.message, err.remedy
        elif isinstance(err, JobwardenError):
            status = _status_of(err)
            message, remedy = err.message, err.remedy
        else:
            message = "internal error (see the server's log)"
        detail = f"{type(err).__name__}: {err}" if status == 500 else message
        self.app.log_error(f"{status} {method} {path}: {_TOKEN_IN_TEXT.sub('token=…', detail)}")
        return error_json(status, message, remedy)

    # --- writing --------------------------------------------------------------------------------

    def _send(self, response: Response) -> None:
        size = _size(response.file)
        self.send_response(response.status)
        headers = {**_SECURITY_HEADERS, **response.headers, "Content-Type": response.content_type}
        headers["Content-Length"] = str(len(response.body) + size)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(response.body)
            if response.file is not None and size:
                _copy(response.file, size, self.wfile)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _stream(self, req: Request, ref: str) -> None:
        """The log as Server-Sent Events; at most MAX_STREAMS at once, each on its own thread."""
        app = self.app
        found = logview.find_log(app, ref, req)
        offset = logview.start_offset(req, found.path)
        if not app.streams.acquire(blocking=False):
            raise HTTPProblem(503, "too many open log streams", "close some job pages")
        try:
            self.send_response(200)
            for name, value in {**_SECURITY_HEADERS, "Content-Type": "text/event-stream"}.items():
                self.send_header(name, value)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def write(data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

            try:
                write(b"retry: 2000\n\n")
                logview.stream(app, found, offset, write)
            except OSError:
                pass  # the page went away (BrokenPipeError, ConnectionResetError)
            except Exception as err:  # the headers are sent: nothing to answer, only to log
                app.log_error(f"log stream of job {ref} ended: {type(err).__name__}: {err}")
        finally:
            app.streams.release()


def _status_of(err: JobwardenError) -> int:
    if isinstance(err, JobNotFound):
        return 404
    if isinstance(err, UsageError):
        return 400
    if isinstance(err, StoreError):
        return 503
    return 409  # the job is not in a state that allows it (nothing to dump, still running...)


def _unauthorized(kind: str) -> Response:
    if kind == "page":
        text = "jobwarden web: open the address `jobwarden web` printed (it carries the token)\n"
        response = text_response(text, 401)
    else:
        response = error_json(401, "a token is needed: ?token=T, or the header Authorization: token T")
    response.headers["WWW-Authenticate"] = 'Bearer realm="jobwarden"'
    return response


def _drop_token_from_address(req: Request) -> Response:
    """`?token=` on a page: set the cookie and send the browser to the same page without the token, so
    it leaves the address bar and the history."""
    rest = urlencode([(k, v) for k, v in parse_qsl(req.query_string) if k != "token"])
    token = auth.token_in_query(req.query_string) or ""
    headers = {"Location": req.path + (f"?{rest}" if rest else ""), "Set-Cookie": auth.cookie_header(token)}
    return Response(303, b"", "text/plain; charset=utf-8", {"Cache-Control": "no-store", **headers})


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except FileNotFoundError:  # no output yet
        return 0


def _copy(path: Path, size: int, out: Any) -> None:
    """Exactly `size` bytes (the Content-Length sent): the log may grow while it is being sent."""
    with open(path, "rb") as fh:
        left = size
        while left > 0:
            chunk = fh.read(min(left, 1 << 20))
            if not chunk:
                out.write(b"\n" * left)  # truncated meanwhile (never by jobwarden): keep the length true
                return
            out.write(chunk)
            left -= len(chunk)


# --- servers --------------------------------------------------------------------------------------


class _Quiet:
    """socketserver prints a traceback for an error outside a handler's own funnel (a browser resetting
    a kept-alive connection, mostly): a gone client is normal, anything else is one line of log."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if not isinstance(err, ConnectionError | TimeoutError):
            print(f"jobwarden web: connection failed: {type(err).__name__}: {err}", file=sys.stderr)


class TCPServer(_Quiet, ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[Handler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


class UnixServer(_Quiet, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # created 0600 from the start (umask), not chmod-ed after: no moment when others may connect
        old = os.umask(0o177)
        try:
            super().server_bind()
        finally:
            os.umask(old)


def clear_stale_socket(path: Path) -> None:
    """A socket file left by a server that died may be replaced; one that answers, or any other file,
    may not."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"--socket: {path} exists and is not a socket", "choose another path")
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
            return
    raise UsageError(f"--socket: another server is listening on {path}", "stop it, or choose another path")


def handler_for(app: App) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"app": app})

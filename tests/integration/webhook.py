"""A webhook on loopback for the notification tests: records each POST, answers with its `status`, and
holds its answers while its `gate` is closed (a slow server)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest


class Hook(http.server.BaseHTTPRequestHandler):
    """Records each POST; answers with the server's status, after its gate opens (a slow server)."""

    def do_POST(self) -> None:
        server: Server = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server.received.append((self.path, self.headers["Content-Type"], json.loads(body)))
        server.arrived.set()
        server.gate.wait(60)
        self.send_response(server.status)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Hook)
        self.received: list[tuple[str, str, dict[str, Any]]] = []
        self.status = 200
        self.gate = threading.Event()
        self.gate.set()
        self.arrived = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/services/T0/B0/secret"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up before its answer (the notifier's own timeout, the point of the slow
        server's tests) is expected: not a traceback in the test run's output."""


@pytest.fixture
def server() -> Iterator[Server]:
    """A webhook on loopback, stopped (its held answers let go) after the test."""
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.gate.set()
        srv.shutdown()
        srv.server_close()
        thread.join(10)

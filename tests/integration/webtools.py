"""Helpers of the web tests: a real `jobwarden web` server (uvicorn) on a free port, serving from a thread
of the test; a plain http.client client; and a reader of Server-Sent Events with a deadline."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from jobwarden.web.server import Served, make_server


@contextmanager
def web_server(home: Path, **options: Any) -> Iterator[Served]:
    served = make_server(home, port=0, **options)  # bound and listening: clients may connect at once
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.stop()  # open streams end at their next poll, open requests get a few seconds
        thread.join(30)
        assert not thread.is_alive()


class Answer(NamedTuple):
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class Client:
    def __init__(self, served: Served) -> None:
        self.served = served
        assert served.port is not None, "a TCP server"
        self.port = served.port
        self.token = served.app.token
        self.origin = f"http://127.0.0.1:{self.port}"

    def connect(self, timeout: float = 60) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> Answer:
        conn = self.connect()
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return Answer(resp.status, resp.headers, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **headers: str) -> Answer:
        return self.request("GET", path, {**self.auth(), **headers})

    def post(self, path: str, headers: dict[str, str] | None = None) -> Answer:
        """A POST as the page's own script sends it, unless `headers` says otherwise."""
        base = {**self.auth(), "X-Jobwarden": "1", "Origin": self.origin}
        return self.request("POST", path, {**base, **(headers or {})}, b"{}")


class Event(NamedTuple):
    name: str
    id: str | None
    data: str


class EventReader:
    """Reads a text/event-stream response event by event (comments kept as name ':')."""

    def __init__(self, client: Client, path: str, headers: dict[str, str] | None = None) -> None:
        self.conn = client.connect(timeout=60)
        self.conn.request("GET", path, headers={**client.auth(), **(headers or {})})
        self.resp = self.conn.getresponse()

    def __enter__(self) -> EventReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()

    def next(self) -> Event:
        name, event_id, data = "message", None, []
        while True:
            raw = self.resp.readline()  # chunked: http.client takes the chunks apart
            if not raw:
                raise EOFError("the stream ended")
            line = raw.decode().rstrip("\n")
            if line == "":
                if data or name != "message" or event_id is not None:
                    return Event(name, event_id, "\n".join(data))
                continue
            if line.startswith(":"):
                return Event(":", None, line[1:].strip())
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "id":
                event_id = value
            elif field == "data":
                data.append(value)

    def text_until(self, wanted: str, deadline_s: float = 60) -> tuple[str, str | None]:
        """Log text received until it contains `wanted`; and the last event id."""
        text, last_id, deadline = "", None, time.monotonic() + deadline_s
        while wanted not in text:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{wanted!r} not streamed; got {text!r}")
            event = self.next()
            if event.name == "log":
                text += json.loads(event.data)["text"]
                last_id = event.id
        return text, last_id

"""`jobwarden web` as a user runs it: its own process, its address read from its first line of output, its
log in a file; and plain sockets to speak to it, malformed requests included. Nothing here imports
jobwarden: these helpers speak to whatever `python -m jobwarden` is."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import NamedTuple
from urllib.parse import urlsplit

from tests.conftest import Jobwarden

START_S = 60  # a loaded 2-core machine: generous, and a deadline all the same
# runs jobwarden with a lower limit of open files (soft and hard), as a shared machine may set it
LIMITED = (
    "import resource, runpy, sys; n = int(sys.argv.pop(1));"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n));"
    "sys.argv[0] = 'jobwarden'; runpy.run_module('jobwarden', run_name='__main__', alter_sys=True)"
)


class WebProcess:
    def __init__(self, jw: Jobwarden, *args: str, nofile: int | None = None) -> None:
        self.log_path = jw.tmp / f"web-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop(): a pipe nobody reads fills
        command = [sys.executable, "-m", "jobwarden", "web", *args]
        if nofile is not None:
            command = [sys.executable, "-c", LIMITED, str(nofile), "web", *args]
        self.proc = subprocess.Popen(command, env=jw.env, stdout=subprocess.PIPE, stderr=self.log)
        self.url = self._first_line()
        parts = urlsplit(self.url)
        self.host_header = parts.netloc
        self.port = parts.port or 80
        self.token = parts.query.removeprefix("token=")
        self.path_base = f"{parts.scheme}://{parts.netloc}"

    def _first_line(self) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_S
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                self.stop()
                raise TimeoutError(f"jobwarden web printed no address: {self.stderr()}")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                self.stop()
                raise RuntimeError(f"jobwarden web ended before its address: {self.stderr()}")
            line += chunk
        return line.decode().strip()

    def stderr(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.log.close()
        return self.proc.returncode

    def __enter__(self) -> WebProcess:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        status = self.stop()
        if kind is None:  # SIGTERM is how a user stops it: a clean exit
            assert status == 0, f"jobwarden web exited {status}: {self.stderr()}"


class Reply(NamedTuple):
    status: int
    head: str  # the status line and headers, as sent
    body: bytes

    def header(self, name: str) -> list[str]:
        wanted = name.lower() + ":"
        return [
            line.partition(":")[2].strip()
            for line in self.head.split("\r\n")
            if line.lower().startswith(wanted)
        ]


def raw_request(port: int, data: bytes, timeout: float = 60, host: str = "127.0.0.1") -> Reply:
    """Send `data` as it is and read the answer until the server closes or its length is complete."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(data)
        reply = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            reply += chunk
            if _complete(reply):
                break
    head, _, body = reply.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
    return Reply(status, head.decode("latin-1"), body)


def _complete(reply: bytes) -> bool:
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def get(web: WebProcess, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> Reply:
    """A request as http.client would write it, with `Host` as the browser would send it."""
    method = "POST" if body else "GET"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {web.host_header}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return raw_request(web.port, "\r\n".join([*lines, "", ""]).encode("latin-1") + body)

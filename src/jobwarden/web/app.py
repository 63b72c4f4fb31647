"""What every request handler shares: where the jobs are, the token and its sessions, the allow-list, the
limits that keep the server standing, and its log."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from jobwarden.osapi.procfs import ProcFS
from jobwarden.text.sanitize import one_line
from jobwarden.web.sessions import Sessions

MAX_STREAMS = 16  # concurrent log streams
HEARTBEAT_S = 15.0  # a comment this often on a quiet stream: proxies and NATs keep it open
LOG_POLL_S = 0.5  # per stream; logfiles.follow's 0.1 s is too eager for many viewers
MAX_LOG_LINE = 500  # characters of one line of the server's log: a 32 KiB request line is not repeated


@dataclass(frozen=True)
class Limits:
    """What one client may hold of the server. Any local user can connect without the token (loopback
    is no boundary on a shared machine), so nothing before the token check may wait without a deadline
    or grow without a cap. Tests shrink these."""

    max_connections: int = 1024  # open at once; past it the longest-idle one is closed for the newcomer
    head_timeout_s: float = 10.0  # a request's line and headers must all arrive within this (slowloris)
    keep_alive_s: int = 5  # an idle kept-alive connection is closed after this
    body_timeout_s: float = 10.0  # a request's body must all arrive within this
    write_timeout_s: float = 60.0  # a client must take each piece of an answer within this
    max_head_bytes: int = 32 << 10  # request line and headers; a browser's cookies for localhost fit
    max_body_bytes: int = 64 << 10  # POST bodies are tiny JSON objects
    workers: int = 8  # threads that run the handlers (store reads, stop, dump)


@dataclass
class App:
    home: Path
    token: str
    allowed_hosts: frozenset[str]
    read_only: bool = False
    limits: Limits = field(default_factory=Limits)
    procfs: ProcFS = field(default_factory=ProcFS)
    heartbeat_s: float = HEARTBEAT_S
    log_poll_s: float = LOG_POLL_S
    streams: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(MAX_STREAMS)
    )
    stopping: threading.Event = field(default_factory=threading.Event)
    sessions: Sessions = field(init=False)

    def __post_init__(self) -> None:
        self.sessions = Sessions(self.token)

    def log_error(self, line: str) -> None:
        log_line(line.replace(self.token, "…"))


def log_line(line: str) -> None:
    """One line of the server's log on stderr. Much of it comes from whoever connected, token or not (a
    path, a header): made safe for a terminal (`text.sanitize`), one line, and cut short."""
    line = one_line(line)
    if len(line) > MAX_LOG_LINE:
        line = line[:MAX_LOG_LINE] + "…"
    print(f"jobwarden web: {line}", file=sys.stderr, flush=True)

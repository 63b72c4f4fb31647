"""What every request handler shares: where the jobs are, the token, the allow-list and the stream budget."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store

MAX_STREAMS = 16  # concurrent log streams; each holds a thread while its page is open
HEARTBEAT_S = 15.0  # a comment this often: a stdlib handler learns its client left only on a write
LOG_POLL_S = 0.5  # per stream; logfiles.follow's 0.1 s is too eager for many viewers


@dataclass
class App:
    home: Path
    token: str
    allowed_hosts: frozenset[str]
    read_only: bool = False
    procfs: ProcFS = field(default_factory=ProcFS)
    heartbeat_s: float = HEARTBEAT_S
    log_poll_s: float = LOG_POLL_S
    streams: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(MAX_STREAMS)
    )
    stopping: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def store(self) -> Iterator[Store]:
        """One Store per request, closed before the answer is written: no read transaction outlives it
        (a reader held open across a log stream would starve the WAL's checkpoints)."""
        with Store(self.home) as store:
            yield store

    def log_error(self, line: str) -> None:
        print(f"jobwarden web: {line}", file=sys.stderr, flush=True)

"""Births and deaths that the 1-second scan would miss: a worker killed 5 ms after it was born.

Two sources, combined where the machine allows (`doctor` says which are in use):
- the kernel's process-event connector (netlink CN_PROC): fork, exec and exit, with the wait status and the
  kernel's timestamp, of every process of the host, so of the job's non-Python processes too;
- the Python hooks' announcements on a FIFO in the run's py dir: `born` as each Python process starts and
  right after each fork(), and `reaped` with the wait status of every child a Python parent reaps (a Pool
  worker reaped by its parent before the shim ever saw it). The same FIFO carries each process's advert
  (`advert {JSON}`), which `on_advert` (shim.tree.pyfiles) writes to its file.

A birth lets the shim open a pidfd at once (the pidfd is what later yields the exit status); a death of a
process it never held is recorded from the event alone. Either source alone is enough for a Python job.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from jobwarden.model import Ranks

if TYPE_CHECKING:  # loaded only once the CLI has its answer (see Starting._start_watches)
    from jobwarden.osapi.procevents import ProcEventListener

FIFO_NAME = "events.fifo"  # the hooks derive the same path from JOBWARDEN_PY_DIR
_MAX_READ = 1 << 16


class Birth(NamedTuple):
    pid: int
    ppid: int
    start_time: int | None  # known when the process announced itself
    ranks: Ranks | None = None
    announced: bool = False  # by the hooks, from inside the job: ours whoever its parent is
    exec: bool = False  # not a new process: an existing one ran exec(), with a new command and environment


class Death(NamedTuple):
    pid: int
    ppid: int  # the parent as the kernel reported it, or the Python process that reaped it
    status: int  # the wait status
    at: float  # unix time of the death (kernel) or of the reaping (hooks)


class Sightings:
    """The shim's ear for births and deaths; `fds()` go into the loop's poll, `drain()` after it wakes."""

    def __init__(self, listener: ProcEventListener | None, fifo_fd: int | None) -> None:
        self.listener = listener
        self.fifo_fd = fifo_fd
        self._partial = b""
        self.on_advert: Callable[[bytes], None] | None = None  # each advert announced, in order

    @classmethod
    def open(cls, fifo: int | None, kernel_events: bool) -> Sightings:
        """The hooks' FIFO (`open_fifo`, when the hooks run) and the connector when the kernel lets this
        process listen. Neither is fatal: the 1 s scan and pidfds remain."""
        listener = None
        if kernel_events:
            from jobwarden.errors import JobwardenError
            from jobwarden.osapi.procevents import ProcEventListener

            with contextlib.suppress(JobwardenError, OSError):
                listener = ProcEventListener.open()
        return cls(listener, fifo)

    @property
    def sources(self) -> str:
        names = [
            name
            for name, on in (("kernel process events", self.listener), ("python hooks", self.fifo_fd))
            if on is not None
        ]
        return " + ".join(names) or "none (1 s scan only)"

    def fds(self, kernel: bool = True) -> list[int]:
        fds = [self.fifo_fd] if self.fifo_fd is not None else []
        if self.listener is not None and kernel:
            fds.append(self.listener.fileno())
        return fds

    def mark(self) -> int | None:
        """The host's last pid, read before a drain: what follow() lets through as born since."""
        if self.listener is None or self.listener.following is False:
            return None
        from jobwarden.osapi.procevents import last_pid

        return last_pid()

    def follow(self, pids: Collection[int], born_after: int | None) -> None:
        """Let the kernel send only the events of `pids` and of processes born after `born_after`
        (osapi.procevents.follow_filter); where it refuses the filter, every event still comes."""
        if self.listener is not None and self.listener.following is not False:
            self.listener.follow(pids, born_after)

    def drain(self) -> tuple[list[Birth], list[Death]]:
        births: list[Birth] = []
        deaths: list[Death] = []
        if self.listener is not None:
            self._kernel_events(self.listener, births, deaths)
        if self.fifo_fd is not None:
            adverts: list[bytes] = []
            for line in self._fifo_lines(self.fifo_fd):
                parse_announcement(line, births, deaths, adverts)
            store = self.on_advert
            if store is not None:
                for advert in adverts:
                    store(advert)
        return births, deaths

    def _kernel_events(self, listener: ProcEventListener, births: list[Birth], deaths: list[Death]) -> None:
        from jobwarden.osapi.procevents import wall_time

        for event in listener.read():
            if event.kind in ("fork", "exec"):
                births.append(Birth(event.pid, event.ppid, None, exec=event.kind == "exec"))
            elif event.kind == "exit" and event.wait_status is not None:
                deaths.append(Death(event.pid, event.ppid, event.wait_status, wall_time(event.at_ns)))

    def _fifo_lines(self, fd: int) -> list[bytes]:
        data = self._partial
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, _MAX_READ):
                data += chunk
        *lines, self._partial = data.split(b"\n")
        return lines

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.fifo_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fifo_fd)
            self.fifo_fd = None


def open_fifo(path: Path) -> int | None:
    """Make the announcement FIFO (0600) and hold it open for reading and writing: O_RDWR never blocks,
    and while the shim holds it a writer never meets a FIFO without reader. A planted file or link at
    the path is never used. None when it cannot be made: the hooks then simply find no reader."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            return None
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        pass  # an adopted run: the same FIFO, still written to by the job's processes
    except OSError:
        return None
    try:
        return os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:  # a link planted meanwhile (ELOOP), a full fd table: never the job's failure
        return None


def parse_announcement(
    line: bytes, births: list[Birth], deaths: list[Death], adverts: list[bytes] | None = None
) -> None:
    """One line the hooks wrote: `born PID START PPID RANK`, `reaped REAPER PID STATUS UNIXTIME` or
    `advert JSON` (its JSON to `adverts`, unread). Anything else (a torn or foreign line) is skipped: the
    job's processes write here."""
    if line.startswith(b"advert "):
        if adverts is not None:
            adverts.append(line[len(b"advert ") :])
        return
    parts = line.split()
    try:
        if len(parts) == 5 and parts[0] == b"born":
            rank = int(parts[4]) if parts[4].isdigit() else None
            ranks = Ranks(rank) if rank is not None else None
            births.append(Birth(int(parts[1]), int(parts[3]), int(parts[2]), ranks, announced=True))
        elif len(parts) == 5 and parts[0] == b"reaped":
            deaths.append(Death(int(parts[2]), int(parts[1]), int(parts[3]), float(parts[4])))
    except ValueError:
        return

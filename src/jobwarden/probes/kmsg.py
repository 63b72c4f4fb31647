"""The kernel log, read from /dev/kmsg without blocking, and the OOM killer's lines in it.

/dev/kmsg gives one record per read(2): "PRIO,SEQ,USEC,FLAGS;message\\n" followed by " KEY=value" lines
(Documentation/ABI/testing/dev-kmsg). Every open file has its own position; a reader that falls behind
the ring buffer gets EPIPE once and continues at the oldest record still there. Reading needs CAP_SYSLOG
while kernel.dmesg_restrict=1 (the usual default), so this says why it cannot read instead of failing.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

_RECORD_MAX = 16384  # a record is < 1 KiB of text plus its dictionary; a short buffer gets EINVAL
_READS_PER_CALL = 8192  # more than a full 1 MiB ring buffer: a flooding driver cannot hold the shim here
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_KERNEL_FACILITY = 0  # userspace writes to /dev/kmsg carry facility 1 (LOG_USER) unless they forge one

# mm/oom_kill.c, since 4.19: "Memory cgroup out of memory: Killed process 1234 (python) total-vm:..."
# (a global OOM says "Out of memory: Killed process"); older kernels print "Killed process" alone.
_KILLED = re.compile(r"Killed process (\d+) \((.*)\) total-vm|Killed process (\d+) \((.*?)\)")
# dump_oom_summary(): "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,
# oom_memcg=/a,task_memcg=/a/b,task=python,pid=1234,uid=0". mems_allowed may hold commas ("0-1,3").
_SUMMARY = re.compile(r"oom-kill:.*?(?:task_memcg=(.*?),)?task=(.*),pid=(\d+),uid=\d+")
_REAPED = re.compile(r"oom_reaper: reaped process (\d+) \(")


@dataclass(frozen=True)
class KernelRecord:
    seq: int
    facility: int
    level: int
    usec: int  # since boot
    message: str


def parse_records(raw: bytes) -> list[KernelRecord]:
    """Records out of a buffer: one from /dev/kmsg (one per read), or many from a saved copy of it.
    Each record is one line; the lines after it that begin with a space are its dictionary."""
    found = []
    for line in raw.split(b"\n"):
        if line and not line.startswith(b" ") and (record := parse_record(line)) is not None:
            found.append(record)
    return found


def parse_record(raw: bytes) -> KernelRecord | None:
    """One /dev/kmsg record; None for anything that is not one (a partial read, garbage)."""
    header, sep, body = raw.partition(b";")
    fields = header.split(b",")
    if not sep or len(fields) < 3:
        return None
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    text = body.split(b"\n", 1)[0]  # the lines after it are the " KEY=value" dictionary
    text = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), text)
    return KernelRecord(seq, prio >> 3, prio & 7, usec, text.decode("utf-8", "replace"))


@dataclass(frozen=True)
class OomLine:
    """A kernel line that names a process the OOM killer chose."""

    pid: int
    comm: str
    memcg: str | None  # the victim's memory cgroup, where the line says (the oom-kill: summary does)
    text: str


def parse_oom_line(message: str) -> OomLine | None:
    if (m := _SUMMARY.search(message)) is not None:
        return OomLine(int(m.group(3)), m.group(2), m.group(1), message)
    if (m := _KILLED.search(message)) is not None:
        if m.group(1) is not None:
            return OomLine(int(m.group(1)), m.group(2), None, message)
        return OomLine(int(m.group(3)), m.group(4), None, message)
    if (m := _REAPED.search(message)) is not None:
        return OomLine(int(m.group(1)), "", None, message)
    return None


def oom_lines(records: list[KernelRecord]) -> list[OomLine]:
    """The OOM killer's lines among kernel records; lines written from userspace are not believed."""
    found = []
    for record in records:
        if record.facility == _KERNEL_FACILITY and (line := parse_oom_line(record.message)):
            found.append(line)
    return found


class KernelLog:
    """A reader of /dev/kmsg that remembers where it was. Never blocks; `error` says why it cannot read."""

    def __init__(self, path: str | Path = "/dev/kmsg") -> None:
        self.path = Path(path)
        self.fd: int | None = None
        self.error: str | None = None
        self.last_seq: int | None = None  # the newest record seen: where a later reader resumes
        self.lost = 0  # times records were overwritten before we read them (EPIPE)
        self._partial = b""

    def open_at_end(self) -> None:
        """Start from now: the records written from here on. `last_seq` stays None until one is read.
        Reading through the buffer to learn the newest sequence number cost every supervisor's start 3-17
        ms (1-7 µs a record, 2,500 records in a full 128 KiB buffer), charged to the job's CPU quota."""
        if self._open():
            assert self.fd is not None
            try:
                os.lseek(self.fd, 0, os.SEEK_END)
            except OSError as err:
                self.error = f"kernel log unreadable: {self.path}: {err.strerror or err}"
                self.close()

    def open_after(self, seq: int | None) -> None:
        """Resume after record `seq` (a saved `last_seq`); None reads the whole buffer."""
        if self._open():
            self.last_seq = seq

    def _open(self) -> bool:
        self.close()
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except PermissionError:
            self.error = (
                f"kernel log unreadable: {self.path} needs root (CAP_SYSLOG) while kernel.dmesg_restrict=1"
            )
        except FileNotFoundError:
            self.error = f"kernel log unreadable: no {self.path} here (usual in containers)"
        except OSError as err:
            self.error = f"kernel log unreadable: {self.path}: {err.strerror or err}"
        else:
            self.error = None
            return True
        return False

    def read_new(self) -> list[KernelRecord]:
        """The records since the last call (or the position given to open_at_end / open_after), at most
        a full buffer's worth per call: a flooding driver cannot hold the caller here."""
        records = []
        for _ in range(_READS_PER_CALL):
            raw = self._next()
            if raw is None:
                break
            for record in parse_records(raw):
                if self.last_seq is None or record.seq > self.last_seq:
                    self.last_seq = record.seq
                    records.append(record)
        return records

    def _next(self) -> bytes | None:
        """The next whole record(s) as read; None when there is nothing newer (or no log). /dev/kmsg gives
        one whole record a read; a saved copy (tests) may end a read mid-line: the rest waits."""
        while self.fd is not None:
            try:
                raw = self._partial + os.read(self.fd, _RECORD_MAX)
                if raw == self._partial:
                    return None  # the end of a saved log
                whole, newline, self._partial = raw.rpartition(b"\n")
                if newline:
                    return whole + newline
            except BlockingIOError:
                return None  # EAGAIN: nothing newer
            except BrokenPipeError:
                self.lost += 1  # overwritten before we got there; the next read continues at the oldest
            except InterruptedError:
                continue
            except OSError as err:
                self.error = f"kernel log read failed: {err.strerror or err}"
                self.close()
        return None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

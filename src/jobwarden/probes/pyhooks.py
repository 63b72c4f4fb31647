"""Read what the Python hooks (jobwarden.hooks) left in a run's py dir, and the job's heartbeat file.

The files are written by the job's processes, which may die or hang mid-write: every reader here skips what it
cannot parse (a partial line, a corrupt advert) instead of failing the diagnosis that needs the rest.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import ProcessId
from jobwarden.observations import ForkRecord, Frame, ThreadStack, UncaughtException
from jobwarden.osapi.procfs import ProcFS

MAX_RECORD_BYTES = 64 << 20  # a runaway file must not exhaust the shim's memory


@dataclass(frozen=True)
class HookAdvert:
    """`<pid>.json`: a Python process of the job that runs the hooks, and what it offers."""

    pid: int
    start_time: int  # clock ticks since boot: with pid, the identity to check before signalling
    python: str  # "3.11.7"
    executable: str
    fault_signal: int  # 0: no faulthandler registered (never send a signal then)
    fault_file: Path | None  # where faulthandler appends its dumps
    ptracer: bool  # Yama lets a descendant of the shim (py-spy) attach
    mp_start: str | None  # the start method the job asked for with --mp-start

    @property
    def process(self) -> ProcessId:
        return ProcessId(self.pid, self.start_time)

    @property
    def dumps_on_signal(self) -> bool:
        return self.fault_signal > 0 and self.fault_file is not None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HookAdvert:
        """Raises ValueError for anything but the exact shape the hooks write."""
        fault_file = _typed(d, "fault_file", str)
        mp_start = d.get("mp_start")
        if mp_start is not None and not isinstance(mp_start, str):
            raise ValueError("mp_start")
        return cls(
            pid=_typed(d, "pid", int),
            start_time=_typed(d, "start_time", int),
            python=_typed(d, "python", str),
            executable=_typed(d, "executable", str),
            fault_signal=_typed(d, "fault_signal", int),
            fault_file=Path(fault_file) if fault_file else None,
            ptracer=_typed(d, "ptracer", bool),
            mp_start=mp_start,
        )


@dataclass(frozen=True)
class Heartbeat:
    """The job's last sign of progress: when, and what it said (empty for a file that was only touched)."""

    at: float  # unix time
    info: dict[str, Any] = field(default_factory=dict)


def _typed(d: dict[str, Any], key: str, kind: type) -> Any:
    value = d[key]
    # bool is an int: an advert with "pid": true is as corrupt as one without a pid
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key}: {value!r} is not {kind.__name__}")
    return value


# --- adverts ----------------------------------------------------------------------------------------


def read_adverts(py_dir: Path) -> dict[int, HookAdvert]:
    """Every readable advert, by pid. An advert is only a claim: check it with `may_signal` before sending."""
    adverts = {}
    for path in _files(py_dir, ".json"):
        try:
            advert = HookAdvert.from_json(json.loads(_read(path)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if str(advert.pid) == path.name.removesuffix(".json"):
            adverts[advert.pid] = advert
    return adverts


def may_signal(advert: HookAdvert, procfs: ProcFS) -> bool:
    """Is it safe to send the advert's fault signal now? The default action of a real-time signal is to
    terminate, and an advert outlives what it describes: the pid may be reused, and a process that exec()ed
    (a subprocess started with preexec_fn, os.execv into a shell) keeps its pid and start time but loses the
    handler. So: same identity, and the kernel says the signal is caught (SigCgt)."""
    if not advert.dumps_on_signal or not procfs.identity_matches(advert.pid, advert.start_time):
        return False
    try:
        return catches_signal(procfs, advert.pid, advert.fault_signal)
    except (ProcessGone, AccessDenied):
        return False


def catches_signal(procfs: ProcFS, pid: int, signum: int) -> bool:
    """Bit signum-1 of SigCgt in /proc/PID/status: a handler is installed for the signal."""
    try:
        status = (procfs.root / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessGone(pid) from err
    except PermissionError as err:
        raise AccessDenied(pid, "read the status of", "it belongs to another user") from err
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


# --- fork records -----------------------------------------------------------------------------------


def read_forks(py_dir: Path) -> list[ForkRecord]:
    """Every fork() made while other threads ran, oldest first, each with its child's pid once the child
    reported in (a child that hung before it could has child_pid None)."""
    records: list[dict[str, Any]] = []
    children: dict[tuple[int, float], int] = {}
    for path in _files(py_dir, ".forks.jsonl"):
        for entry in _json_lines(path):
            if "child_pid" in entry:
                try:
                    children[(_typed(entry, "parent_pid", int), float(entry["fork_at"]))] = _typed(
                        entry, "child_pid", int
                    )
                except (KeyError, ValueError, TypeError):
                    continue
            else:
                records.append(entry)
    found = []
    for entry in records:
        try:
            record = _fork_record(entry)
        except (KeyError, ValueError, TypeError, AttributeError):
            continue
        child = children.get((record.parent_pid, record.at))
        found.append(record if child is None else _with_child(record, child))
    return sorted(found, key=lambda r: (r.at, r.parent_pid))


def _fork_record(d: dict[str, Any]) -> ForkRecord:
    threads = tuple(
        ThreadStack(
            tid=t.get("tid") if isinstance(t.get("tid"), int) else None,
            name=t.get("name") if isinstance(t.get("name"), str) else None,
            frames=_frames(t.get("frames") or []),
        )
        for t in d["threads"]
    )
    return ForkRecord(
        parent_pid=_typed(d, "parent_pid", int),
        at=float(d["at"]),
        stack=_frames(d["stack"]),
        threads=threads,
    )


def _frames(items: list[dict[str, Any]]) -> tuple[Frame, ...]:
    return tuple(
        Frame(
            str(f["function"]),
            str(f.get("file") or ""),
            f.get("line") if isinstance(f.get("line"), int) else None,
        )
        for f in items
    )


def _with_child(record: ForkRecord, child_pid: int) -> ForkRecord:
    return ForkRecord(record.parent_pid, record.at, record.stack, record.threads, child_pid)


# --- uncaught exceptions ---------------------------------------------------------------------------


def read_exceptions(py_dir: Path) -> list[UncaughtException]:
    """The first uncaught exception of each Python process of the run (`<pid>.exc.json`), oldest first;
    a record that does not parse is left out."""
    found = []
    for path in _files(py_dir, ".exc.json"):
        try:
            found.append(_exception(json.loads(_read(path))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return sorted(found, key=lambda e: e.at)


def _exception(d: dict[str, Any]) -> UncaughtException:
    rank = d.get("rank")
    return UncaughtException(
        pid=_typed(d, "pid", int),
        at=float(d["at"]),
        type=_typed(d, "type", str),
        message=_typed(d, "message", str),
        frames=_frames(d.get("frames") or []),
        chain=tuple((str(c["type"]), str(c["message"])) for c in d.get("chain") or []),
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
    )


# --- faulthandler dumps -----------------------------------------------------------------------------

_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME_LINE = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')


def read_fault_dump(path: Path, offset: int = 0) -> tuple[tuple[ThreadStack, ...], int]:
    """The threads of the dump(s) written to `path` after `offset`, and the offset to read from next.

    faulthandler appends each dump with no end marker: note the file's size before sending the signal and
    read from there once it has grown (the handler writes the whole dump before it returns)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(MAX_RECORD_BYTES)
    except FileNotFoundError:
        return (), offset
    return parse_fault_dump(data.decode("utf-8", "replace")), offset + len(data)


def parse_fault_dump(text: str) -> tuple[ThreadStack, ...]:
    """faulthandler's all-threads format: per thread a header, then 'File "f", line n in func' lines,
    innermost first. Its thread ids are pthread handles, not kernel tids: the current thread is named so."""
    threads: list[ThreadStack] = []
    name: str | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            if name is not None:
                threads.append(ThreadStack(None, name, tuple(frames)))
            name = "current thread" if header.group(1) == "Current thread" else f"thread {header.group(2)}"
            frames = []
            continue
        frame = _FRAME_LINE.match(line)
        if frame and name is not None:
            lineno = frame.group(2)
            frames.append(Frame(frame.group(3), frame.group(1), int(lineno) if lineno.isdigit() else None))
    if name is not None:
        threads.append(ThreadStack(None, name, tuple(frames)))
    return tuple(threads)


# --- heartbeat --------------------------------------------------------------------------------------


def read_heartbeat(path: Path) -> Heartbeat | None:
    """None if the job never beat. A file that was only touched (any language can) counts by its mtime."""
    try:
        mtime = path.stat().st_mtime
        text = _read(path)
    except OSError:
        return None
    try:
        payload = json.loads(text)
    except ValueError:
        return Heartbeat(mtime)
    if not isinstance(payload, dict):
        return Heartbeat(mtime)
    at = payload.get("at")
    info = payload.get("info")
    written_at = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else mtime
    return Heartbeat(max(mtime, written_at), info if isinstance(info, dict) else {})


# --- helpers ----------------------------------------------------------------------------------------


def _files(py_dir: Path, suffix: str) -> Iterator[Path]:
    """`<pid><suffix>` files, in pid order; temporary files and anything else left aside."""
    try:
        names = os.listdir(py_dir)
    except OSError:
        return
    for name in sorted(names, key=lambda n: (len(n), n)):
        if name.endswith(suffix) and name.removesuffix(suffix).isdigit():
            yield py_dir / name


def _read(path: Path) -> str:
    with open(path, "rb") as fh:
        return fh.read(MAX_RECORD_BYTES).decode("utf-8", "replace")


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """Complete JSON object lines; a writer that died mid-line leaves a fragment that is skipped."""
    try:
        text = _read(path)
    except OSError:
        return
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry

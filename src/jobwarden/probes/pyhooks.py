"""Read what the Python hooks (jobwarden.hooks) left in a run's py dir, and the job's heartbeat file.

The files are written by the job's processes, which may die or hang mid-write: every reader here skips what it
cannot parse (a partial line, a corrupt advert) instead of failing the diagnosis that needs the rest.
"""

from __future__ import annotations

import array
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jobwarden.model import ProcessId
from jobwarden.observations import ForkRecord, ForkRequest, Frame, ThreadStack, UncaughtException
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.regularfile import read_regular
from jobwarden.progress.model import MAX_COUNT, MAX_LABEL, Bar, HookProgress, finite_metrics

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
    program: tuple[int, int] | None = None  # (device, inode) of the interpreter; None from older hooks
    # the descriptor faulthandler writes to and (device, inode) of its file: the job may close it and get
    # the number back for its own data, which a dump would then write into (None: older hooks)
    fault_fd: int | None = None
    fault_file_id: tuple[int, int] | None = None
    withdrawn: str | None = None  # why the hooks took the signal back ("the job set signal 35 to ...")

    @property
    def process(self) -> ProcessId:
        return ProcessId(self.pid, self.start_time)

    @property
    def dumps_on_signal(self) -> bool:
        # an advert without the program it was written by cannot be told from one an exec() made stale,
        # nor one without the descriptor from one whose file the job closed
        return (
            self.fault_signal > 0
            and self.fault_file is not None
            and self.program is not None
            and self.fault_fd is not None
            and self.fault_file_id is not None
        )

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HookAdvert:
        """Raises ValueError for anything but the exact shape the hooks write."""
        fault_file = _typed(d, "fault_file", str)
        mp_start = d.get("mp_start")
        if mp_start is not None and not isinstance(mp_start, str):
            raise ValueError("mp_start")
        fault_fd = d.get("fault_fd")
        if fault_fd is not None and not (_is_int(fault_fd) and fault_fd >= 0):
            raise ValueError(f"fault_fd: {fault_fd!r}")
        withdrawn = d.get("fault_withdrawn")
        return cls(
            pid=_typed(d, "pid", int),
            start_time=_typed(d, "start_time", int),
            python=_typed(d, "python", str),
            executable=_typed(d, "executable", str),
            fault_signal=_typed(d, "fault_signal", int),
            fault_file=Path(fault_file) if fault_file else None,
            ptracer=_typed(d, "ptracer", bool),
            mp_start=mp_start,
            program=_program(d.get("exe")),
            fault_fd=fault_fd,
            fault_file_id=_program(d.get("fault_file_id")),
            withdrawn=withdrawn[:200] if isinstance(withdrawn, str) else None,
        )


def _program(value: object) -> tuple[int, int] | None:
    """The hooks write "exe": [st_dev, st_ino] of /proc/self/exe, or null where they could not stat it;
    "fault_file_id" the same of their stacks file."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value)):
        raise ValueError(f"exe: {value!r}")
    return value[0], value[1]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        advert = _advert(path)
        if advert is not None:
            adverts[advert.pid] = advert
    return adverts


def read_advert(py_dir: Path | None, pid: int) -> HookAdvert | None:
    """The advert process `pid` left, or None (no hook, unreadable, or not in the expected shape)."""
    return None if py_dir is None else _advert(py_dir / f"{pid}.json")


def _advert(path: Path) -> HookAdvert | None:
    try:
        advert = HookAdvert.from_json(json.loads(_read(path)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return advert if str(advert.pid) == path.name.removesuffix(".json") else None


def writes_to_its_file(advert: HookAdvert, procfs: ProcFS) -> bool:
    """faulthandler writes, from C, to the descriptor it was given: true only while /proc/PID/fd/N is still
    the advertised stacks file, and that file is the one at the advertised path (the one we read). A job
    that closed its descriptors (os.closerange) and opened its own files has the number for its data."""
    if advert.fault_fd is None or advert.fault_file_id is None or advert.fault_file is None:
        return False
    try:
        st = advert.fault_file.stat()
    except OSError:
        return False
    return procfs.open_file(advert.pid, advert.fault_fd) == advert.fault_file_id == (st.st_dev, st.st_ino)


ANNOUNCED_WITHIN_S = 1.0  # the shim reads the FIFO as it wakes: milliseconds, unless it is busy starting
EVENTS_FIFO = "events.fifo"  # shim.tree.sightings.FIFO_NAME: the hooks derive the same path from their py dir


def settle_adverts(py_dir: Path, timeout_s: float = ANNOUNCED_WITHIN_S) -> bool:
    """Wait, at most `timeout_s`, until the run's shim has read what the hooks announced on their FIFO: a
    process born this instant announces its advert there and the shim writes the file
    (shim.tree.pyfiles.store_advert). Bytes unread in the FIFO are in flight; once they are read, the shim
    writes the files at once, so a moment is left for that too. False when they stay unread (no shim)."""
    fd = _open_fifo(py_dir / EVENTS_FIFO)
    if fd is None:
        return True
    try:
        deadline = time.monotonic() + timeout_s
        if _unread(fd) == 0:
            return True
        while _unread(fd) > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        time.sleep(0.02)  # read, being written: one drain writes every advert it read, milliseconds
        return True
    finally:
        os.close(fd)


def _open_fifo(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if stat.S_ISFIFO(os.fstat(fd).st_mode):
        return fd  # only looked at (FIONREAD), never read: the lines are the shim's
    os.close(fd)
    return None


def _unread(fd: int) -> int:
    import fcntl
    import termios

    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count)
    except OSError:
        return 0
    return count[0]


# --- fork records -----------------------------------------------------------------------------------


def read_forks(py_dir: Path) -> list[ForkRecord]:
    """Every fork() made while other threads ran that the hooks recorded, oldest first, each with its
    child's pid once the child reported in (a child that hung before it could has child_pid None).

    The hooks write the first forks of each call site in full and then only a count (`forks`, at powers of
    two); each child names its fork in its own advert (`forked`). A child forked after its site's full
    records gets a record of its own, with the site's stack and threads, marked not exact."""
    records, sites, counts, links = _fork_files(py_dir)
    adverts = _advert_links(py_dir)
    for child, (parent, at, site, n) in adverts.items():
        links[(parent, at)] = child
        counts[(parent, site)] = max(counts.get((parent, site), 0), n)
    latest: dict[tuple[int, int], ForkRecord] = {}  # (parent, site) -> the site's latest full record
    for key, record in sorted(records.items(), key=lambda kv: kv[1].at):
        if key in sites:
            latest[(key[0], sites[key])] = record
    found = []
    for key, record in records.items():
        forks = counts.get((key[0], sites[key]), 1) if key in sites else 1
        found.append(replace(record, child_pid=links.get(key), site_forks=max(forks, 1)))
    for child, (parent, at, site, n) in adverts.items():
        model = latest.get((parent, site))
        if (parent, at) not in records and model is not None:
            forks = max(counts.get((parent, site), 1), n)
            found.append(replace(model, at=at, child_pid=child, site_forks=forks, exact=False))
    return sorted(found, key=lambda r: (r.at, r.parent_pid))


_ForkKey = tuple[int, float]  # (parent pid, when it forked)


def _fork_files(
    py_dir: Path,
) -> tuple[dict[_ForkKey, ForkRecord], dict[_ForkKey, int], dict[tuple[int, int], int], dict[_ForkKey, int]]:
    """The `<pid>.forks.jsonl` files: full records, each one's site number, the counts by (parent, site),
    and the children named by older hooks' link lines."""
    records: dict[_ForkKey, ForkRecord] = {}
    sites: dict[_ForkKey, int] = {}
    counts: dict[tuple[int, int], int] = {}
    links: dict[_ForkKey, int] = {}
    for path in _files(py_dir, ".forks.jsonl"):
        for entry in _json_lines(path):
            try:
                if "child_pid" in entry:
                    parent = _typed(entry, "parent_pid", int)
                    links[(parent, float(entry["fork_at"]))] = _typed(entry, "child_pid", int)
                elif "threads" in entry:
                    record = _fork_record(entry)
                    records[(record.parent_pid, record.at)] = record
                    if _is_int(entry.get("site")):
                        sites[(record.parent_pid, record.at)] = entry["site"]
                else:
                    site = (_typed(entry, "parent_pid", int), _typed(entry, "site", int))
                    counts[site] = max(counts.get(site, 0), _typed(entry, "forks", int))
            except (KeyError, ValueError, TypeError, AttributeError):
                continue
    return records, sites, counts, links


def _advert_links(py_dir: Path) -> dict[int, tuple[int, float, int, int]]:
    """child pid -> (parent pid, fork time, site, forks there) of the children that say, in their advert,
    they were forked beside other threads."""
    found: dict[int, tuple[int, float, int, int]] = {}
    for path in _files(py_dir, ".json"):
        try:
            advert = json.loads(_read(path))
            forked = advert.get("forked") if isinstance(advert, dict) else None
            if not isinstance(forked, dict):
                continue
            found[_typed(advert, "pid", int)] = (
                _typed(forked, "parent_pid", int),
                float(forked["fork_at"]),
                _typed(forked, "site", int),
                _typed(forked, "n", int),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


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


def read_caught(py_dir: Path) -> list[UncaughtException]:
    """The exceptions each process formatted without dying of them (`<pid>.caught.jsonl`: a worker's
    task error on its way to the parent, or what it printed as it ended), oldest first."""
    found = []
    for path in _files(py_dir, ".caught.jsonl"):
        for entry in _json_lines(path):
            try:
                found.append(_exception(entry))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return sorted(found, key=lambda e: e.at)


def read_fork_requests(py_dir: Path) -> list[ForkRequest]:
    """Where processes asked multiprocessing for "fork" by name (`<pid>.start-method.jsonl`)."""
    found = []
    for path in _files(py_dir, ".start-method.jsonl"):
        for entry in _json_lines(path):
            try:
                found.append(
                    ForkRequest(_typed(entry, "pid", int), float(entry["at"]), _frames(entry["stack"]))
                )
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return sorted(found, key=lambda r: r.at)


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
        executable=d.get("executable") if isinstance(d.get("executable"), str) else None,
    )


# --- faulthandler dumps -----------------------------------------------------------------------------

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


# --- progress bars ----------------------------------------------------------------------------------

PROGRESS_SUFFIX = ".progress"
MAX_PROGRESS_BYTES = 64 << 10  # 16 bars of a few hundred bytes; a bigger file is not the hooks'


def read_progress(py_dir: Path, pid: int) -> HookProgress | None:
    """The bars process `pid` last recorded (`<pid>.progress`), or None: none, unreadable, not the shape
    the hooks write. The job writes the file: every field is checked, none is trusted as a type."""
    try:
        raw = read_regular(py_dir / f"{pid}{PROGRESS_SUFFIX}", MAX_PROGRESS_BYTES)
        data = json.loads(raw.decode("utf-8", "replace"))
        if not isinstance(data, dict) or data.get("pid") != pid:
            return None
        at = data["at"]
        if isinstance(at, bool) or not isinstance(at, int | float):
            return None
        bars = tuple(b for b in (_bar(entry) for entry in data.get("bars") or ()) if b is not None)
        return HookProgress(
            pid, _optional_int(data.get("rank")), float(at), bars, _optional_int(data.get("epoch"))
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def progress_mtime(py_dir: Path, pid: int) -> int | None:
    """When `<pid>.progress` last changed (ns), to read it again only then."""
    try:
        return os.stat(py_dir / f"{pid}{PROGRESS_SUFFIX}").st_mtime_ns
    except OSError:
        return None


def _bar(entry: object) -> Bar | None:
    if not isinstance(entry, dict):
        return None
    n = _optional_int(entry.get("n"))
    kind = entry.get("kind")
    if n is None or n < 0 or kind not in ("tqdm", "keras", "rich"):
        return None
    metrics = entry.get("metrics")
    return Bar(
        kind=str(kind),
        n=n,
        total=_optional_int(entry.get("total")),
        unit=_optional_str(entry.get("unit")),
        desc=_optional_str(entry.get("desc")),
        position=max(_optional_int(entry.get("pos")) or 0, 0),
        closed=entry.get("closed") is True,
        postfix=_optional_str(entry.get("postfix")),
        metrics=finite_metrics(metrics.items()) if isinstance(metrics, dict) else (),
    )


def _optional_int(value: object) -> int | None:
    """An int of a record, within what a counter (and SQLite's INTEGER) holds."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if -MAX_COUNT <= value <= MAX_COUNT else None


def _optional_str(value: object) -> str | None:
    return value[:MAX_LABEL] if isinstance(value, str) else None


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
    return read_regular(path, MAX_RECORD_BYTES).decode("utf-8", "replace")


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

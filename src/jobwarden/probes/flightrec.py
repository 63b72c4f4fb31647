"""PyTorch's flight recorder of each rank, asked for on a hang and read back (hooks: `serve_recorder`).

A rank whose hooks serve the recorder has a FIFO `<pid>.fr.req` in the py dir; a thread of the hooks sleeps
in read() on it. The shim writes one byte there (O_NONBLOCK: never waits on a full or readerless FIFO;
ENXIO says no process has it open any more) and the rank answers by replacing `<pid>.fr.json`, at once
without the calls' stacks and again with them. A poll (the byte POLL) is answered in `<pid>.fr.poll.json`
with when the rank called each collective its recorder holds (`read_arrivals`). The files are the job's:
nothing in them is trusted (size, types and counts are checked, and a file that is not the expected shape
is left out).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.observations import Arrival, CollectiveCall, Frame, RankRecorder
from jobwarden.osapi.regularfile import read_regular

REQUEST = ".fr.req"
DUMP = ".fr.json"
ARRIVALS = ".fr.poll.json"
HANG, POLL = b"?", b"p"  # the hooks' POLL_REQUEST
MAX_ARRIVALS_BYTES = 1 << 17  # 256 rows of 5 short fields: ~20 KB
MAX_ARRIVALS = 512  # rows read at most (the hooks write their POLL_ENTRIES, 256)
MAX_DUMP_BYTES = 1 << 20  # the hooks keep theirs below this
MAX_CALLS = 256
MAX_FRAMES = 16
MAX_TENSORS = 32
WAIT_S = 2.0  # the most a judgement waits for the answers, all ranks together
POLL_S = 0.02


@dataclass(frozen=True)
class Asked:
    """A request written to one rank, and what its dump file was before it (None: there was none)."""

    pid: int
    path: Path
    before: tuple[int, int, int] | None  # (st_ino, st_mtime_ns, st_size)


def request(py_dir: Path, pids: Iterable[int]) -> list[Asked]:
    """Write a request to each of `pids` that serves its recorder; the ones asked."""
    asked = []
    for pid in pids:
        dump = py_dir / f"{pid}{DUMP}"
        before = version(dump)
        if _write_request(py_dir / f"{pid}{REQUEST}"):
            asked.append(Asked(pid, dump, before))
    return asked


def poll(py_dir: Path, pid: int) -> bool:
    """Ask `pid` for its arrivals (answered in `<pid>.fr.poll.json`); False where it serves no recorder."""
    return _write_request(py_dir / f"{pid}{REQUEST}", POLL)


def _write_request(fifo: Path, byte: bytes = HANG) -> bool:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # ENOENT: not a rank; ENXIO: no reader (the rank ended); ELOOP: a symlink, not ours
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, byte)
    except OSError as err:
        return err.errno == errno.EAGAIN  # requests already waiting: this one is answered with them
    finally:
        os.close(fd)
    return True


def collect(
    asked: Sequence[Asked],
    wait_s: float = WAIT_S,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[RankRecorder]:
    """The answers, waiting at most `wait_s` for all of them: an answer with the stacks ends a rank's wait;
    at the deadline the stackless one is taken where that is all there is."""
    deadline = monotonic() + wait_s
    found: dict[int, RankRecorder] = {}
    complete: set[int] = set()
    seen = {a.pid: a.before for a in asked}  # the version of each file last read (or found before asking)
    while True:
        for a in asked:
            now = version(a.path)
            if a.pid in complete or now == seen[a.pid]:
                continue
            seen[a.pid] = now
            read = read_dump(a.path)
            if read is not None:
                recorder, with_stacks = read
                found[a.pid] = recorder
                if with_stacks:
                    complete.add(a.pid)
        left = deadline - monotonic()
        if len(complete) == len(asked) or left <= 0:
            return [found[a.pid] for a in asked if a.pid in found]
        sleep(min(POLL_S, left))


def version(path: Path) -> tuple[int, int, int] | None:
    """What tells one answer from the next: each is a new file renamed over the last, but its inode number
    may be the one just freed and its mtime the same coarse tick (the answer with stacks follows the one
    without within 0.1 ms once torch has symbolised them); the stacks make it longer."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_dump(path: Path) -> tuple[RankRecorder, bool] | None:
    """`<pid>.fr.json` and whether it carries the stacks; None for anything but the hooks' shape."""
    d = _job_json(path, MAX_DUMP_BYTES)
    if not isinstance(d, dict) or str(d.get("pid")) != path.name.removesuffix(DUMP):
        return None
    try:
        return parse(d), d.get("stacks") is True
    except (ValueError, TypeError, KeyError):
        return None


def read_arrivals(path: Path, pid: int) -> tuple[Arrival, ...] | None:
    """`<pid>.fr.poll.json`, checked: None for anything but the hooks' shape, or another process's."""
    d = _job_json(path, MAX_ARRIVALS_BYTES)
    if not isinstance(d, dict) or d.get("pid") != pid or not isinstance(d.get("arrivals"), list):
        return None
    try:
        return tuple(_arrival(row) for row in d["arrivals"][-MAX_ARRIVALS:])
    except (ValueError, TypeError):
        return None


def _job_json(path: Path, max_bytes: int) -> object:
    """A JSON file the job wrote, parsed; None where it is larger than `max_bytes`, not a regular file
    (a FIFO, a symlink), or not JSON (RecursionError: nested thousands deep)."""
    try:
        raw = read_regular(path, max_bytes + 1)
    except OSError:
        return None
    if len(raw) > max_bytes:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _arrival(row: object) -> Arrival:
    """One row, checked inline: a poll's answer holds hundreds (the shim reads each rank's every 10 s)."""
    if type(row) is not list or len(row) != 5:
        raise ValueError("arrival")
    group, seq, op, created, duration = row
    if type(group) is not str or type(op) is not str or type(seq) is not int or type(created) is not int:
        raise ValueError("group, seq, op, created")
    if not (0 <= seq < 1 << 62 and 0 <= created < 1 << 62):
        raise ValueError("seq, created")
    if duration is not None and (type(duration) not in (int, float) or not 0 <= duration < 1e9):
        raise ValueError("duration")
    return Arrival(group[:100], seq, op.rpartition(":")[2][:100], created, duration)


def parse(d: dict[str, Any]) -> RankRecorder:
    """The dump's fields, checked; raises ValueError/TypeError/KeyError for anything else."""
    rank = d.get("rank")
    entries = d["entries"]
    if not isinstance(entries, list) or (rank is not None and not _is_int(rank)):
        raise ValueError("entries, rank")
    calls = tuple(c for c in (_call(e) for e in entries[-MAX_CALLS:]) if c is not None)
    return RankRecorder(_int(d["pid"]), rank, float(d["at"]), calls)


def _call(e: object) -> CollectiveCall | None:
    """One entry; None for a point-to-point one (send/recv have no collective sequence number)."""
    if not isinstance(e, dict):
        raise TypeError("entry")
    if e.get("p2p") is True:
        return None
    group = e.get("group")
    if not (isinstance(group, list) and group and all(isinstance(g, str) for g in group)):
        raise ValueError("group")
    op = e.get("op")
    if not isinstance(op, str):
        raise ValueError("op")
    return CollectiveCall(
        group=group[0][:100],  # [name, desc]: subgroups share new_group's desc "undefined", never a name
        seq=_int(e.get("seq")),
        op=op.rpartition(":")[2][:100],
        sizes=_sizes(e.get("sizes")),
        done=e.get("retired") is True,
        frames=_frames(e.get("frames")),
        group_desc=group[-1][:100] if len(group) > 1 else "",
    )


def _sizes(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        raise ValueError("sizes")
    shapes = []
    for shape in value[:MAX_TENSORS]:
        if not isinstance(shape, list) or len(shape) > 16:
            raise ValueError("shape")
        shapes.append(tuple(_int(n) for n in shape))
    return tuple(shapes)


def _frames(value: object) -> tuple[Frame, ...]:
    if not isinstance(value, list):
        return ()
    found = []
    for f in value[:MAX_FRAMES]:
        if isinstance(f, dict) and isinstance(f.get("function"), str) and isinstance(f.get("file"), str):
            line = f.get("line")
            found.append(Frame(f["function"][:200], f["file"][:1000], line if _is_int(line) else None))
    return tuple(found)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object) -> int:
    if not _is_int(value) or not 0 <= value < 1 << 62:  # type: ignore[operator]
        raise ValueError(f"not a count: {value!r}")
    return value  # type: ignore[return-value]

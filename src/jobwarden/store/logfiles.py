"""The job's output file and its offset->time index.

The job writes output.log itself (its own fd, O_APPEND); the shim never touches those bytes. Once a tick
the shim appends "WALLTIME SIZE" to output.idx when the size changed, so `logs --since` can find where a
moment starts to within one tick.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


class LogWatcher:
    """The shim's side: index the output's growth, and tell how much room the log has left."""

    def __init__(self, output: Path, index: Path) -> None:
        self.output, self.index_path = output, index
        self._last_size = -1

    def index(self, now: float) -> None:
        try:
            size = self.output.stat().st_size
        except OSError:
            return
        if size == self._last_size:
            return
        self._last_size = size
        with contextlib.suppress(OSError):  # a full disk must not stop supervision
            fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, f"{now:.3f} {size}\n".encode())
            finally:
                os.close(fd)

    def free_bytes(self) -> int | None:
        """Free space on the filesystem holding the log; None when it cannot be read."""
        try:
            st = os.statvfs(self.output.parent)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize


def since_offset(index: Path, since_wall: float) -> int:
    """The byte offset from which output was written at or after `since_wall`: the size the log had at
    the last entry before it. Read as a stream, up to the first entry at or after it (a week's index is
    some 600,000 lines)."""
    last: tuple[float, int] | None = None
    with contextlib.suppress(OSError), open(index, "rb") as fh:
        for line in fh:
            entry = _index_entry(line)
            # a torn or damaged line is skipped; the index only ever grows, so it must stay sorted
            if entry is None or (last is not None and (entry[0] < last[0] or entry[1] < last[1])):
                continue
            if entry[0] >= since_wall:
                break
            last = entry
    return last[1] if last is not None else 0


def _index_entry(line: bytes) -> tuple[float, int] | None:
    """(wall time, size) from a "WALLTIME SIZE" line; None for anything else."""
    parts = line.split()
    if len(parts) != 2 or not parts[1].isdigit():
        return None
    try:
        at = float(parts[0])
    except ValueError:
        return None
    return (at, int(parts[1])) if math.isfinite(at) else None


CHUNK = 1 << 20  # what a reader of the log holds at once: a 1 GiB log is streamed, never read whole


def stream_from(path: Path, offset: int, chunk: int = CHUNK) -> Iterator[bytes]:
    """The bytes of `path` from the first line that starts at or after `offset`, to its end as it is
    when the read gets there, in chunks of at most `chunk` bytes."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; opened apart to catch only this
    except FileNotFoundError:
        return
    with fh:
        fh.seek(_line_start(fh, offset))
        while data := fh.read(chunk):
            yield data


def _line_start(fh: BinaryIO, offset: int) -> int:
    """`offset` when a line starts there, else the start of the next line; found in chunks, so that a
    progress bar's endless line is never read whole."""
    if offset <= 0:
        return 0
    fh.seek(offset - 1)
    pos = offset - 1
    while data := fh.read(CHUNK):
        newline = data.find(b"\n")
        if newline >= 0:
            return pos + newline + 1
        pos += len(data)
    return pos


def read_from(path: Path, offset: int, align_to_line: bool = True, limit: int = -1) -> bytes:
    """Bytes of `path` from `offset`, starting at a line start when `offset` falls mid-line; at most
    `limit` bytes when it is not negative."""
    try:
        with open(path, "rb") as fh:
            if offset > 0 and align_to_line:
                fh.seek(offset - 1)
                if fh.read(1) != b"\n":
                    fh.readline()
            else:
                fh.seek(offset)
            return fh.read(limit)
    except FileNotFoundError:
        return b""


_TAIL_MAX_BYTES = 8 << 20


def tail_lines(path: Path, n: int, block: int = 1 << 16, start: int = 0) -> list[bytes]:
    """The last `n` lines, read backwards in blocks: cheap on a 100 GiB log. With `start`, none of the
    lines that begin before the first line start at or after it (`logs --since 1h -n 20`)."""
    if n <= 0:
        return []
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; opened apart to catch only this
    except FileNotFoundError:
        return []
    with fh:
        floor = _line_start(fh, start) if start > 0 else 0
        end = fh.seek(0, os.SEEK_END)
        blocks, newlines, pos = [], 0, end
        # count per block (linear, not re-scanning a growing buffer) and stop at a cap: a progress bar
        # that never writes "\n" must not make `status` read a whole 100 GiB log
        while pos > floor and newlines <= n and end - pos < _TAIL_MAX_BYTES:
            step = min(block, pos - floor)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step)
            blocks.append(chunk)
            newlines += chunk.count(b"\n")
        data = b"".join(reversed(blocks))
    # split on b"\n" only, as `tail -n` does: a progress bar's bare \r redraws one line, not many
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    return lines[-n:]


def follow(path: Path, offset: int, is_done: Callable[[], bool], poll_s: float = 0.1) -> Iterator[bytes]:
    """Yield new output from `offset` until `is_done()` is true and everything has been read (at most
    CHUNK bytes at a time: `run -f` of a job that already wrote gigabytes)."""
    while True:
        done = is_done()  # read before the data: no output written before the end is missed
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read(CHUNK)
        except FileNotFoundError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            yield chunk
        elif done:
            return
        else:
            time.sleep(poll_s)

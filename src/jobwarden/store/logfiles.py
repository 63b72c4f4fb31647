"""The job's output file and its offset->time index.

The job writes output.log itself (its own fd, O_APPEND); the shim never writes those bytes. Once a tick
the shim appends "WALLTIME SIZE" to output.idx when the size changed, so `logs --since` can find where a
moment starts to within one tick.

`--log-max` (LogWatcher.trim): when the log holds more than its cap on disk, the shim frees its middle
(osapi.sparse.punch_hole) and keeps the head (the first quarter of the cap: how the job started, its
first error) and the newest half. The file keeps its length and every offset its place, so the index
stays right and the job's O_APPEND writes go on untouched; the freed range is a hole, which the readers
here skip, saying how much was dropped. On disk the log stays within the cap plus what the job writes in
one tick.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from jobwarden.config import format_size

HEAD_SHARE = 4  # the head kept is the cap / 4
TAIL_SHARE = 2  # the newest cap / 2 is kept; trimming starts again once the log is back at its cap
CHUNK = 1 << 20  # what a reader of the log holds at once: a 1 GiB log is streamed, never read whole


class Trim(NamedTuple):
    """The log's one hole: [start, end) dropped to keep it within `max_bytes`; or why it cannot be."""

    start: int
    end: int
    max_bytes: int
    unsupported: str | None = None  # the file system cannot free a range (its error)


class LogWatcher:
    """The shim's side: index the output's growth, keep it within its cap, and tell how much room the
    log has left. `max_bytes`: the cap on disk (0: none)."""

    def __init__(self, output: Path, index: Path, max_bytes: int = 0) -> None:
        self.output, self.index_path = output, index
        self.max_bytes = max_bytes
        self.trim: Trim | None = None  # the latest trim, or why there can be none
        self.grew = 0  # bytes written since the look before the last
        self._last_size = -1

    @property
    def size(self) -> int:
        """The log's size at the last `index`; -1 before the first."""
        return self._last_size

    def index(self, now: float, cap: bool = True) -> None:
        """Note the log's size at `now` when it changed; and keep it within its cap, unless `cap` is
        false (the run's end: recorded first, capped after, see `cap_now`)."""
        try:
            st = self.output.stat()
        except OSError:
            return
        size = st.st_size
        self.grew = max(0, size - self._last_size) if self._last_size >= 0 else size
        if size == self._last_size:
            return
        self._last_size = size
        if cap and self.max_bytes and st.st_blocks * 512 > self.max_bytes:
            self._cap(size, st.st_blksize)
        with contextlib.suppress(OSError):  # a full disk must not stop supervision
            fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, f"{now:.3f} {size}\n".encode())
            finally:
                os.close(fd)

    @property
    def growing_fast(self) -> bool:
        """Written an eighth of the cap or more since the look before: worth a look before the next tick
        (a job printing 1 GiB a second would otherwise be a second's output over its cap)."""
        return bool(self.max_bytes and self.grew >= self.max_bytes // 8)

    def cap_now(self) -> None:
        """Keep the log within its cap now, whether or not it grew since the last look."""
        try:
            st = self.output.stat()
        except OSError:
            return
        if self.max_bytes and st.st_blocks * 512 > self.max_bytes:
            self._cap(st.st_size, st.st_blksize)

    def _cap(self, size: int, block: int) -> None:
        """Free the middle: keep [0, head) and the newest max/TAIL_SHARE, at block boundaries (a
        partial block would be zeroed, not freed, and read as data)."""
        if self.trim is not None and self.trim.unsupported:
            return
        head = _align_up(self.max_bytes // HEAD_SHARE, block)
        end = (size - self.max_bytes // TAIL_SHARE) // block * block
        if end <= max(head, self.trim.end if self.trim else 0):
            return
        from jobwarden.osapi.sparse import UNSUPPORTED, punch_hole

        try:
            fd = os.open(self.output, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            punch_hole(fd, head, end - head)  # again over the part freed before: a no-op there
        except OSError as err:
            if err.errno in UNSUPPORTED:
                self.trim = Trim(0, 0, self.max_bytes, unsupported=err.strerror or str(err))
            return
        finally:
            os.close(fd)
        self.trim = Trim(head, end, self.max_bytes)

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


def stream_from(path: Path, offset: int) -> Iterator[bytes]:
    """The output from the first line that starts at or after `offset` to the end as it is when the read
    gets there, in pieces of at most CHUNK bytes, with a marker line where --log-max dropped a range."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; opened apart to catch only this
    except FileNotFoundError:
        return
    with fh:
        start = _line_start(fh, offset)
        yield from _with_markers(fh, start, os.fstat(fh.fileno()).st_size)


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


def _align_up(n: int, block: int) -> int:
    return -(-n // block) * block


def data_spans(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The ranges of [start, end) that hold data: all of it, but for the hole --log-max freed. Where the
    file system cannot tell (no SEEK_DATA), all of it."""
    spans: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as err:
            if err.errno == errno.ENXIO:  # nothing but a hole from here to the end
                break
            return [(start, end)]
        if data >= end:
            break
        hole = os.lseek(fd, data, os.SEEK_HOLE)
        spans.append((data, min(hole, end)))
        pos = hole
    return spans


def dropped_marker(n: int) -> bytes:
    """What the readers show in place of a trimmed range."""
    return f"[jobwarden: {format_size(n)} of output dropped here to keep the log within --log-max]\n".encode()


def iter_output(path: Path, offset: int = 0, limit: int = -1) -> Generator[bytes, None, None]:
    """The log's bytes from `offset` (at most `limit` of them when not negative), with a marker line
    where --log-max dropped a range, in pieces of at most CHUNK bytes: a 100 GiB log is never held whole."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; opened apart to catch only this
    except FileNotFoundError:
        return
    with fh:
        end = os.fstat(fh.fileno()).st_size
        if limit >= 0:
            end = min(end, offset + limit)
        yield from _with_markers(fh, offset, end)


def output_length(path: Path, end: int) -> int:
    """How many bytes iter_output(path, 0, end) yields (the file's first `end` bytes, a marker line in
    place of what --log-max freed): a download's Content-Length, found without reading the data."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; opened apart to catch only this
    except FileNotFoundError:
        return 0
    with fh:
        pos, total, last = 0, 0, b"\n"
        for start, stop in data_spans(fh.fileno(), 0, end):
            if start > pos:
                total += len(_marker_after(last, start - pos))
            total += stop - start
            last = os.pread(fh.fileno(), 1, stop - 1) or last
            pos = stop
        if end > pos:
            total += len(_marker_after(last, end - pos))
        return total


def _marker_after(last: bytes, dropped: int) -> bytes:
    """The marker line for `dropped` bytes after output that ended with `last`: on a line of its own."""
    return (b"" if last == b"\n" else b"\n") + dropped_marker(dropped)


def _with_markers(fh: BinaryIO, offset: int, end: int) -> Iterator[bytes]:
    """[offset, end) as data and a marker line per range --log-max freed. The shim may free more while
    this reads (a job writing 80 MB/s keeps it trimming): where data is is looked up again for every
    chunk, and a chunk is kept only as far as it is still data once read (`_read_data`)."""
    fd = fh.fileno()
    pos, last = offset, b"\n"
    while pos < end:
        at = _data_from(fd, pos, end)
        data = _read_data(fd, at, min(CHUNK, end - at)) if at < end else None
        if data is None:  # only a hole up to `end`, or the file ends before it
            break
        if not data:
            continue  # freed between the look and the read: look again where data starts now
        if at > pos:
            yield _marker_after(last, at - pos)
        yield data
        pos, last = at + len(data), data[-1:]
    if end > pos:  # a hole up to the end: the job wrote nothing since, or its data is being freed now
        yield _marker_after(last, end - pos)


def _data_from(fd: int, pos: int, end: int) -> int:
    """Where data starts at or after `pos`: `end` when only a hole is left before it; `pos` where the
    file system cannot tell (no SEEK_DATA)."""
    try:
        return min(os.lseek(fd, pos, os.SEEK_DATA), end)
    except OSError as err:
        return end if err.errno == errno.ENXIO else pos


def _read_data(fd: int, pos: int, n: int) -> bytes | None:
    """Up to `n` bytes at `pos`, cut where they stopped being data: the part --log-max freed while they
    were read reads as zeros, never output. b"": `pos` itself was freed; None: the file ends there.
    Checked after the read, which is enough: a freed range is never data again (the job appends at the
    end; the hole only grows), so what is data now was data while it was read."""
    data = os.pread(fd, n, pos)
    if not data:
        return None
    return data[: _data_length(fd, pos, len(data))]


def _data_length(fd: int, pos: int, n: int) -> int:
    """How many of the `n` bytes at `pos` are data now."""
    try:
        if os.lseek(fd, pos, os.SEEK_DATA) != pos:
            return 0
        return min(n, os.lseek(fd, pos, os.SEEK_HOLE) - pos)
    except OSError as err:
        return 0 if err.errno == errno.ENXIO else n  # freed up to the end; or no SEEK_DATA: all data


def read_piece(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """At most `limit` bytes of the log from `offset`, and the offset to read from next. Where --log-max
    freed the range at `offset`, a marker line instead, and the next offset past the freed range: a
    reader that goes by offsets (the web's log pages and stream) never gets the freed range's zeros."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; opened apart to catch only this
    except FileNotFoundError:
        return b"", offset
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if offset >= size:
            return b"", offset
        fd = fh.fileno()
        data = _read_data(fd, offset, limit) if _data_from(fd, offset, size) == offset else b""
        if data is None:
            return b"", offset
        if not data:  # freed (maybe while it was read): a marker on a line of its own, as iter_output puts it
            data_at = _data_from(fd, offset, size)
            before = os.pread(fd, 1, offset - 1) if offset > 0 else b"\n"
            return _marker_after(before or b"\n", data_at - offset), data_at
        return data, offset + len(data)


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


def tail_lines(
    path: Path, n: int, block: int = 1 << 16, start: int = 0, end: int | None = None
) -> list[bytes]:
    """The last `n` lines, read backwards in blocks: cheap on a 100 GiB log. With `start`, none of the
    lines that begin before the first line start at or after it (`logs --since 1h -n 20`); with `end`,
    the last lines before that offset (`logs -f` follows from there: nothing written meanwhile is lost)."""
    if n <= 0:
        return []
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; opened apart to catch only this
    except FileNotFoundError:
        return []
    with fh:
        first = _line_start(fh, start) if start > 0 else 0  # `logs --since`: not before its range
        size = fh.seek(0, os.SEEK_END)
        end = size if end is None else min(end, size)
        # never into a range --log-max freed: its zeros are not output (the newest data starts after it)
        window = max(0, end - _TAIL_MAX_BYTES - block)
        spans = data_spans(fh.fileno(), window, end) if end else []
        floor = max(first, spans[-1][0] if spans else end)
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
        dropped = _hole_before(fh.fileno(), floor) if pos == floor > window and newlines <= n else 0
        # the shim may have freed part of what was read meanwhile: the newest data starts after that hole
        newest = _newest_data(fh.fileno(), pos, end) if data else pos
        if newest > pos:
            data, dropped = data[newest - pos :], _hole_before(fh.fileno(), newest)
    # split on b"\n" only, as `tail -n` does: a progress bar's bare \r redraws one line, not many
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    if dropped:
        lines.insert(0, dropped_marker(dropped))
    return lines[-n:]


def _newest_data(fd: int, start: int, end: int) -> int:
    """Where the last range of data in [start, end) begins now; `end` when none is left."""
    spans = data_spans(fd, start, end)
    return spans[-1][0] if spans else end


def _hole_before(fd: int, data_start: int) -> int:
    """The size of the hole that ends at `data_start`."""
    spans = data_spans(fd, 0, data_start)
    return data_start - (spans[-1][1] if spans else 0)


def follow(path: Path, offset: int, is_done: Callable[[], bool], poll_s: float = 0.1) -> Iterator[bytes]:
    """Yield new output from `offset` until `is_done()` is true and everything has been read, at most
    CHUNK bytes at a time (`run -f` of a job that already wrote gigabytes). A range --log-max freed before
    it was read is a marker line."""
    while True:
        done = is_done()  # read before the data: no output written before the end is missed
        data, offset = read_new(path, offset)
        if data:
            yield data
        elif done:
            return
        else:
            time.sleep(poll_s)


def read_new(path: Path, offset: int) -> tuple[bytes, int]:
    """What the log holds from `offset` (at most CHUNK bytes; a marker line for a range --log-max freed),
    and the offset to read from next: one look of `follow`, for a reader that follows several logs."""
    try:
        with open(path, "rb") as fh:
            end = min(os.fstat(fh.fileno()).st_size, offset + CHUNK)
            chunks = list(_with_markers(fh, offset, end)) if end > offset else []
    except FileNotFoundError:
        return b"", offset
    return (b"".join(chunks), end) if chunks else (b"", offset)


def line_start(path: Path, offset: int) -> int:
    """The offset of the first line that starts at or after `offset` (`logs --since`)."""
    try:
        with open(path, "rb") as fh:
            return _line_start(fh, offset)
    except FileNotFoundError:
        return 0

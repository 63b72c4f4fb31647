"""--log-max on a real file (store.logfiles): the shim frees the middle while a writer keeps appending on
its own O_APPEND fd, and every reader skips the hole with one marker line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobwarden.store.logfiles import (
    LogWatcher,
    data_spans,
    dropped_marker,
    follow,
    iter_output,
    read_piece,
    since_offset,
    tail_lines,
)

CAP = 1 << 20


def appender(path: Path) -> int:
    """The job's side: its own descriptor, O_APPEND, as jobwarden gives it."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def lines(start: int, count: int) -> bytes:
    return b"".join(b"line %07d %s\n" % (i, b"x" * 80) for i in range(start, start + count))


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "output.log"


def test_the_middle_is_freed_the_offsets_kept_and_the_writer_untouched(log: Path, tmp_path: Path) -> None:
    fd = appender(log)
    watcher = LogWatcher(log, tmp_path / "output.idx", CAP)
    try:
        os.write(fd, lines(0, 40_000))  # 3.6 MiB
        watcher.index(1000.0)
        trim = watcher.trim
        assert trim is not None and trim.unsupported is None
        assert os.stat(log).st_blocks * 512 <= CAP  # on disk: within the cap
        os.write(fd, b"after the trim\n")  # the job's fd goes on at the end
    finally:
        os.close(fd)
    size = os.stat(log).st_size
    assert size == len(lines(0, 40_000)) + len(b"after the trim\n")
    with open(log, "rb") as fh:
        assert data_spans(fh.fileno(), 0, size) == [(0, trim.start), (trim.end, size)]
    assert trim.start == CAP // 4 and size - trim.end >= CAP // 2
    text = b"".join(iter_output(log))
    assert text.startswith(lines(0, 3))
    assert text.endswith(b"after the trim\n") and b"\0" not in text
    assert text.count(dropped_marker(trim.end - trim.start)) == 1
    assert since_offset(tmp_path / "output.idx", 999.0) == 0  # the index's offsets mean what they meant


def test_tail_lines_never_read_the_hole_and_say_it_when_asked_past_it(log: Path, tmp_path: Path) -> None:
    log.write_bytes(lines(0, 40_000))
    watcher = LogWatcher(log, tmp_path / "output.idx", CAP)
    watcher.index(1.0)
    assert watcher.trim is not None
    assert tail_lines(log, 2) == lines(39_998, 2).splitlines(keepends=True)
    everything = tail_lines(log, 10**6)
    assert everything[0] == dropped_marker(watcher.trim.end - watcher.trim.start)
    assert all(b"\0" not in line for line in everything)


def test_follow_from_the_start_skips_a_hole_freed_behind_it(log: Path, tmp_path: Path) -> None:
    log.write_bytes(lines(0, 40_000))
    LogWatcher(log, tmp_path / "output.idx", CAP).index(1.0)
    out = b"".join(follow(log, 0, lambda: True))
    assert out.startswith(lines(0, 1)) and out.endswith(lines(39_999, 1))
    assert b"[jobwarden: " in out and b"\0" not in out


def test_the_cap_off_or_not_reached_frees_nothing(log: Path, tmp_path: Path) -> None:
    log.write_bytes(lines(0, 40_000))
    for cap in (0, 8 * CAP):
        watcher = LogWatcher(log, tmp_path / f"idx{cap}", cap)
        watcher.index(1.0)
        assert watcher.trim is None
    assert b"".join(iter_output(log)) == lines(0, 40_000)


# --- a range freed while a reader reads it ---------------------------------------------------------------
#
# `logs --since 2s -n all` on a job writing 80 MB/s printed megabytes of NULs: the reader looked up where
# data was once, and the shim freed part of it before the read. Here the shim's trim runs at the worst
# moment: after the reader's look, before its read.


def trim_before_the_next_read(monkeypatch: pytest.MonkeyPatch, log: Path, tmp_path: Path) -> LogWatcher:
    """The shim's trim, made to run just before the reader's next os.pread."""
    watcher = LogWatcher(log, tmp_path / "output.idx", CAP)
    real_pread = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        if watcher.trim is None:
            watcher.index(1.0)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    return watcher


def test_a_range_freed_while_the_log_is_streamed_is_a_marker_never_zeros(
    monkeypatch: pytest.MonkeyPatch, log: Path, tmp_path: Path
) -> None:
    log.write_bytes(lines(0, 40_000))
    watcher = trim_before_the_next_read(monkeypatch, log, tmp_path)
    out = b"".join(iter_output(log))
    assert watcher.trim is not None  # it happened during the read
    assert b"\0" not in out
    assert out.startswith(lines(0, 3)) and out.endswith(lines(39_999, 1))
    assert out.count(dropped_marker(watcher.trim.end - watcher.trim.start)) == 1


def test_a_range_freed_while_a_piece_is_read_is_a_marker(
    monkeypatch: pytest.MonkeyPatch, log: Path, tmp_path: Path
) -> None:
    log.write_bytes(lines(0, 40_000))
    watcher = trim_before_the_next_read(monkeypatch, log, tmp_path)
    offset, pieces = 0, []
    while offset < log.stat().st_size:
        data, offset = read_piece(log, offset, CAP)
        pieces.append(data)
    out = b"".join(pieces)
    assert watcher.trim is not None and b"\0" not in out
    assert out.count(dropped_marker(watcher.trim.end - watcher.trim.start)) == 1
    assert out.endswith(lines(39_999, 1))


def test_a_range_freed_while_the_tail_is_read_is_a_marker(
    monkeypatch: pytest.MonkeyPatch, log: Path, tmp_path: Path
) -> None:
    from jobwarden.store import logfiles

    log.write_bytes(lines(0, 40_000))
    watcher = LogWatcher(log, tmp_path / "output.idx", CAP)
    real_spans = logfiles.data_spans

    def spans_then_trim(fd: int, start: int, end: int) -> list[tuple[int, int]]:
        found = real_spans(fd, start, end)
        if watcher.trim is None:  # the tail looked where data is: the shim trims before it reads
            watcher.index(1.0)
        return found

    monkeypatch.setattr(logfiles, "data_spans", spans_then_trim)
    everything = tail_lines(log, 10**6)
    assert watcher.trim is not None
    assert all(b"\0" not in line for line in everything)
    assert everything[0] == dropped_marker(watcher.trim.end - watcher.trim.start)
    assert everything[-1] == lines(39_999, 1)

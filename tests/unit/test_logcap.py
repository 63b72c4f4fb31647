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
    read_output,
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
    text = read_output(log)
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
    assert read_output(log) == lines(0, 40_000)

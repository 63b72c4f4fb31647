"""The job's output file and its offset->time index: `logs --since`, `logs -n`, and the shim's indexer."""

from __future__ import annotations

import errno
import stat
from pathlib import Path

import pytest

from jobwarden.store.logfiles import LogWatcher, read_from, since_offset, tail_lines

# "WALLTIME SIZE" lines as the shim appends them, one per tick in which the output grew.
INDEX = "1700000100.000 10\n1700000200.000 25\n1700000300.000 40\n"


@pytest.fixture
def index(tmp_path: Path) -> Path:
    path = tmp_path / "output.idx"
    path.write_text(INDEX)
    return path


# --- since_offset ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("since", "offset"),
    [
        (1700000000.0, 0),  # before the first tick: everything
        (1700000100.0, 0),
        (1700000150.0, 10),  # what was indexed before the moment is skipped
        (1700000200.0, 10),  # a tick exactly at the moment may hold output from just before it: kept
        (1700000200.001, 25),
        (1700000299.0, 25),
        (1700000400.0, 40),  # after the last tick: only what the next tick will index
    ],
)
def test_since_offset(index: Path, since: float, offset: int) -> None:
    assert since_offset(index, since) == offset


def test_since_offset_without_an_index_is_the_start(tmp_path: Path) -> None:
    assert since_offset(tmp_path / "missing.idx", 1700000200.0) == 0


def test_since_offset_skips_torn_and_blank_lines(tmp_path: Path) -> None:
    # A full disk can cut a line short; such lines are skipped, not fatal.
    path = tmp_path / "output.idx"
    path.write_text("1700000100.000 10\n\n1700000150.0\n1700000200.000 25\n1700000250.000 30 extra\n")
    assert since_offset(path, 1700000300.0) == 25


# --- read_from ------------------------------------------------------------------------------------

TEXT = b"first line\nsecond line\nthird\n"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "output.log"
    path.write_bytes(TEXT)
    return path


def test_read_from_the_start(log: Path) -> None:
    assert read_from(log, 0) == TEXT


def test_read_from_a_line_start(log: Path) -> None:
    assert read_from(log, TEXT.index(b"second")) == b"second line\nthird\n"


def test_read_from_mid_line_starts_at_the_next_line(log: Path) -> None:
    assert read_from(log, TEXT.index(b"line\nsecond")) == b"second line\nthird\n"
    assert read_from(log, TEXT.index(b"second") + 1) == b"third\n"


def test_read_from_the_newline_itself_starts_at_the_next_line(log: Path) -> None:
    assert read_from(log, TEXT.index(b"\nsecond")) == b"second line\nthird\n"


def test_read_from_without_aligning(log: Path) -> None:
    assert read_from(log, 3, align_to_line=False) == TEXT[3:]


def test_read_from_the_end_or_beyond_is_empty(log: Path) -> None:
    assert read_from(log, len(TEXT)) == b""
    assert read_from(log, len(TEXT) + 100) == b""


def test_read_from_mid_way_through_an_unfinished_last_line_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_bytes(b"done\nstill writ")
    assert read_from(path, 7) == b""


def test_read_from_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_from(tmp_path / "missing.log", 0) == b""


def test_since_offset_and_read_from_together(tmp_path: Path) -> None:
    out, idx = tmp_path / "output.log", tmp_path / "output.idx"
    watcher = LogWatcher(out, idx)
    with open(out, "ab") as fh:
        fh.write(b"epoch 1\n")
        fh.flush()
        watcher.index(100.0)
        fh.write(b"epoch 2\n")
        fh.flush()
        watcher.index(200.0)
        fh.write(b"epoch 3\n")
        fh.flush()
        watcher.index(300.0)
    assert read_from(out, since_offset(idx, 250.0)) == b"epoch 3\n"
    assert read_from(out, since_offset(idx, 150.0)) == b"epoch 2\nepoch 3\n"
    assert read_from(out, since_offset(idx, 50.0)) == b"epoch 1\nepoch 2\nepoch 3\n"


# --- tail_lines -----------------------------------------------------------------------------------


def lines(count: int, width: int = 30) -> list[bytes]:
    return [f"line {i:05d} ".encode().ljust(width, b"x") + b"\n" for i in range(count)]


def test_tail_of_a_file_many_blocks_long(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    content = lines(2000)
    path.write_bytes(b"".join(content))
    assert tail_lines(path, 5, block=64) == content[-5:]
    assert tail_lines(path, 100, block=64) == content[-100:]


def test_tail_with_lines_longer_than_a_block(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    content = lines(50, width=500)
    path.write_bytes(b"".join(content))
    assert tail_lines(path, 3, block=64) == content[-3:]


def test_tail_with_the_default_block_size(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    content = lines(10_000)  # about 300 KiB: several 64 KiB blocks
    path.write_bytes(b"".join(content))
    assert tail_lines(path, 60) == content[-60:]


def test_tail_of_a_file_without_a_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_bytes(b"".join(lines(100)) + b"progress: 99%")
    assert tail_lines(path, 2, block=16) == [lines(100)[-1], b"progress: 99%"]


def test_tail_asking_for_more_lines_than_there_are(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_bytes(b"a\nb\n")
    assert tail_lines(path, 10, block=1) == [b"a\n", b"b\n"]


def test_tail_of_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert tail_lines(empty, 5) == []
    assert tail_lines(tmp_path / "missing.log", 5) == []
    assert tail_lines(empty, 0) == []


def test_tail_of_zero_lines(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_bytes(b"a\nb\n")
    assert tail_lines(path, 0) == []
    assert tail_lines(path, -1) == []


def test_tail_counts_lines_as_tail_does_with_progress_bars(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    bar = b"train:  10%|#  |\rtrain:  50%|##  |\rtrain: 100%|###|\n"
    path.write_bytes(b"epoch 1\n" + bar + b"saved\n")
    assert tail_lines(path, 2) == [bar, b"saved\n"]


# --- LogWatcher -----------------------------------------------------------------------------------


def test_index_writes_a_line_only_when_the_size_changes(tmp_path: Path) -> None:
    out, idx = tmp_path / "output.log", tmp_path / "output.idx"
    out.write_bytes(b"hello\n")
    watcher = LogWatcher(out, idx)
    watcher.index(100.0)
    watcher.index(101.0)  # nothing new: no line
    watcher.index(102.0)
    with open(out, "ab") as fh:
        fh.write(b"world\n")
    watcher.index(103.5)
    watcher.index(104.0)
    assert idx.read_text() == "100.000 6\n103.500 12\n"


def test_index_of_an_empty_output_records_size_zero_once(tmp_path: Path) -> None:
    out, idx = tmp_path / "output.log", tmp_path / "output.idx"
    out.write_bytes(b"")
    watcher = LogWatcher(out, idx)
    watcher.index(1.0)
    watcher.index(2.0)
    assert idx.read_text() == "1.000 0\n"


def test_index_before_the_output_exists_writes_nothing(tmp_path: Path) -> None:
    out, idx = tmp_path / "output.log", tmp_path / "output.idx"
    LogWatcher(out, idx).index(1.0)
    assert not idx.exists()


def test_the_index_is_private(tmp_path: Path) -> None:
    out, idx = tmp_path / "output.log", tmp_path / "output.idx"
    out.write_bytes(b"x")
    LogWatcher(out, idx).index(1.0)
    assert stat.S_IMODE(idx.stat().st_mode) & 0o077 == 0


def test_index_survives_an_unwritable_index(tmp_path: Path) -> None:
    # A full disk or a vanished run directory must not stop supervision.
    out = tmp_path / "output.log"
    out.write_bytes(b"x")
    LogWatcher(out, tmp_path / "gone" / "output.idx").index(1.0)


def test_free_bytes_of_the_log_filesystem(tmp_path: Path) -> None:
    out = tmp_path / "output.log"
    out.write_bytes(b"")
    free = LogWatcher(out, tmp_path / "output.idx").free_bytes()
    assert isinstance(free, int) and free >= 0


def test_free_bytes_when_the_run_directory_is_gone(tmp_path: Path) -> None:
    out = tmp_path / "gone" / "output.log"
    assert LogWatcher(out, tmp_path / "gone" / "output.idx").free_bytes() is None


def test_the_index_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    output, index = tmp_path / "output.log", tmp_path / "output.idx"
    output.write_text("a line\n")
    index.symlink_to(victim)
    LogWatcher(output, index).index(1.0)
    assert victim.read_text() == "precious\n"


def test_a_job_is_never_started_into_a_symlinked_log(tmp_path: Path) -> None:
    from jobwarden.osapi.process import spawn_job

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    log = tmp_path / "output.log"
    log.symlink_to(victim)
    with pytest.raises(OSError) as caught:
        spawn_job(["true"], str(tmp_path), {}, str(log))
    assert caught.value.errno == errno.ELOOP
    assert victim.read_text() == "precious\n"

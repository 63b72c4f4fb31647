"""/proc/PID/io: storage bytes read and written, parsed from captured files; unreadable ones tolerated."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from jobwarden.errors import ProcessGone
from jobwarden.osapi.procfs import ProcFS, ProcIO, parse_io

# `python -c` that wrote 1 MiB to a file on ext4 and flushed it, captured from /proc/self/io (Linux 6.x).
CAPTURED_IO = (
    b"rchar: 1685830\n"
    b"wchar: 1050265\n"
    b"syscr: 666\n"
    b"syscw: 30\n"
    b"read_bytes: 12288\n"
    b"write_bytes: 1052672\n"
    b"cancelled_write_bytes: 0\n"
)
# The same file cut short: a field the kernel does not give counts 0, never fails the sample.
CHARS_ONLY_IO = b"rchar: 6976\nwchar: 0\nsyscr: 10\nsyscw: 0\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "4665").mkdir(parents=True)
    (proc / "4665" / "io").write_bytes(CAPTURED_IO)
    return proc


def test_parse_io_reads_storage_bytes_not_characters() -> None:
    assert parse_io(CAPTURED_IO) == ProcIO(read_bytes=12288, write_bytes=1052672)


def test_parse_io_without_storage_fields_counts_zero() -> None:
    assert parse_io(CHARS_ONLY_IO) == ProcIO(0, 0)


def test_io_of_a_process_in_an_injected_root(root: Path) -> None:
    assert ProcFS(root).io(4665) == ProcIO(12288, 1052672)


def test_io_of_a_vanished_process_is_gone(root: Path) -> None:
    with pytest.raises(ProcessGone):
        ProcFS(root).io(4666)


def _denied_read(fd: int, size: int) -> bytes:
    raise PermissionError(errno.EACCES, "Permission denied")


def test_another_users_io_refused_on_read_is_unknown(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what the kernel does (here even for root, on pid 1 of the container): the open succeeds, the read
    # fails with EACCES
    monkeypatch.setattr("jobwarden.osapi.procfs.os.read", _denied_read)
    assert ProcFS(root).io(4665) is None


def test_another_users_io_refused_on_open_is_unknown(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def deny_io(path: Any, flags: int, *args: Any) -> int:
        if str(path).endswith("/io"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr("jobwarden.osapi.procfs.os.open", deny_io)
    assert ProcFS(root).io(4665) is None


def test_io_of_this_process_grows_as_it_writes(tmp_path: Path) -> None:
    procfs = ProcFS()
    before = procfs.io(os.getpid())
    assert before is not None
    with open(tmp_path / "data", "wb") as fh:
        fh.write(os.urandom(1 << 20))
        fh.flush()
    after = procfs.io(os.getpid())
    assert after is not None
    assert after.write_bytes - before.write_bytes >= 1 << 20

"""A small secret of our own (`web.token`) read through osapi.sharedfiles without trusting what lies at its
path, and written by `write_private` so that nobody else sees it."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from jobwarden.osapi.sharedfiles import Refused, Trust, read_file, write_private


def read_private_file(path: Path, max_bytes: int) -> bytes:
    return read_file(path, max_bytes, Trust(secret=True))


def test_a_private_file_is_read_and_written_atomically(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_private(path, b"abc\n")
    assert read_private_file(path, 16) == b"abc\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_private(path, b"new\n")
    assert read_private_file(path, 16) == b"new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]  # no temporary file left
    with pytest.raises(FileNotFoundError):
        read_private_file(tmp_path / "missing", 16)


def _planted(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "secret"
    if kind == "symbolic link":
        (tmp_path / "target").write_text("looks like a token\n")
        path.symlink_to(tmp_path / "target")
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path, 0o600)  # no writer: a blocking open would wait for ever
    elif kind == "directory":
        path.mkdir(mode=0o700)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    return path


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        ("symbolic link", "a symbolic link"),
        ("link to /dev/zero", "a symbolic link"),
        ("FIFO", "a FIFO"),
        ("directory", "a directory"),
        ("socket", "a socket"),
    ],
)
def test_what_is_no_regular_file_is_never_read(tmp_path: Path, kind: str, what: str) -> None:
    path = _planted(tmp_path, kind)
    with pytest.raises(Refused) as err:
        read_private_file(path, 16)
    assert err.value.not_a_file and what in err.value.why


def test_a_file_that_holds_no_secret_is_not_returned(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_private(path, b"x" * 17)
    with pytest.raises(Refused, match="17 bytes, over the 16"):
        read_private_file(path, 16)
    write_private(path, b"abc")
    path.chmod(0o640)
    with pytest.raises(Refused, match="others may read"):
        read_private_file(path, 16)
    if os.geteuid() == 0:  # as root: a file of another user's
        path.chmod(0o600)
        os.chown(path, 65534, 65534)
        with pytest.raises(Refused, match="belongs to uid 65534"):
            read_private_file(path, 16)


def test_a_name_planted_where_the_temporary_file_goes_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    for i in range(64):  # every name is random: a planted one is simply never chosen
        (tmp_path / f".secret.{i:016x}").symlink_to(victim)
    write_private(tmp_path / "secret", b"abc")
    assert victim.read_text() == "untouched"

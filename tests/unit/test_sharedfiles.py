"""osapi.sharedfiles: the one reader of files from shared places. Every check, each with a real file system
object: links, FIFOs, devices, folders, files too large, files and folders others may write or own."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from jobwarden.osapi.sharedfiles import Refused, SharedDir, Trust, read_file
from tests.support import unavailable

OTHER_UID = 4242


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def test_a_regular_file_of_ours_is_read_whole(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    (folder / "a.json").write_bytes(b"{}\n")
    with SharedDir.open(folder) as d:
        assert d.read_bytes("a.json", 10) == b"{}\n"
        assert d.names() == ["a.json"]


def test_a_link_is_never_followed_inside(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    (folder / "zero").symlink_to("/dev/zero")
    (folder / "sub").symlink_to(tmp_path)
    with SharedDir.open(folder) as d:
        with pytest.raises(Refused, match="a symbolic link"):
            d.read_bytes("zero", 1 << 20)
        with pytest.raises(Refused, match="a symbolic link"):
            d.subdir("sub")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    os.mkfifo(folder / "fifo")
    with SharedDir.open(folder) as d, pytest.raises(Refused, match=r"not a regular file \(a FIFO\)"):
        d.read_bytes("fifo", 100)


def test_devices_sockets_and_folders_are_no_files(tmp_path: Path) -> None:
    with pytest.raises(Refused, match="a character device"):
        read_file(Path("/dev/zero"), 100, Trust(owners=frozenset({0, os.geteuid()})), check_folder=False)
    folder = private_dir(tmp_path / "g")
    (folder / "dir").mkdir()
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(folder / "sock"))
        with SharedDir.open(folder) as d:
            with pytest.raises(Refused, match="a directory"):
                d.read_bytes("dir", 100)
            with pytest.raises(OSError):  # a socket cannot even be opened
                d.read_bytes("sock", 100)
    finally:
        server.close()


def test_a_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    (folder / "big").write_bytes(b"x" * 101)
    with SharedDir.open(folder) as d:
        with pytest.raises(Refused, match="101 bytes, over the 100"):
            d.read_bytes("big", 100)
        assert d.read_bytes("big", 101) == b"x" * 101


def test_lines_over_the_line_cap_are_left_out_and_counted(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    (folder / "r.jsonl").write_bytes(b"short\n" + b"y" * 50 + b"\n\nlast")
    with SharedDir.open(folder) as d:
        read = d.read_lines("r.jsonl", 1000, 10)
    assert (read.lines, read.too_long) == ([b"short", b"last"], 1)


def test_folders_and_files_others_may_write_are_refused(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    (folder / "f").write_bytes(b"x")
    (folder / "f").chmod(0o622)
    with SharedDir.open(folder) as d, pytest.raises(Refused, match="others may write it"):
        d.read_bytes("f", 10)
    folder.chmod(0o777)
    with pytest.raises(Refused, match=r"others may write to it \(mode 0777\)"):
        SharedDir.open(folder)


def test_a_secret_must_not_be_readable_by_others(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "home")
    token = folder / "web.token"
    token.write_bytes(b"t" * 64)
    token.chmod(0o644)
    with pytest.raises(Refused, match="others may read or write it"):
        read_file(token, 4096, Trust(secret=True))
    token.chmod(0o600)
    assert read_file(token, 4096, Trust(secret=True)) == b"t" * 64
    assert read_file(token, 4096) == b"t" * 64


def test_only_names_inside_the_folder(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    with SharedDir.open(folder) as d:
        for name in ("../x", "..", "", "a/b"):
            with pytest.raises(Refused, match="not a name inside"):
                d.read_bytes(name, 10)


def test_the_folder_named_may_be_reached_through_our_own_link(tmp_path: Path) -> None:
    real = private_dir(tmp_path / "real")
    (real / "a").write_bytes(b"1")
    link = tmp_path / "link"
    link.symlink_to(real)
    with SharedDir.open(link) as d:
        assert d.read_bytes("a", 10) == b"1"


def test_names_stop_at_the_limit(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "g")
    for i in range(20):
        (folder / f"f{i}").touch()
    with SharedDir.open(folder) as d:
        assert len(d.names(limit=5)) == 5


def test_another_users_folder_file_and_link_are_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("only root can give a file to another user")
    theirs = private_dir(tmp_path / "theirs")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(Refused, match=f"belongs to uid {OTHER_UID}"):
        SharedDir.open(theirs)
    ours = private_dir(tmp_path / "ours")
    (ours / "f").write_bytes(b"x")
    os.chown(ours / "f", OTHER_UID, OTHER_UID)
    (ours / "sub").mkdir(mode=0o700)
    os.chown(ours / "sub", OTHER_UID, OTHER_UID)
    link = tmp_path / "their-link"
    link.symlink_to(ours)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with SharedDir.open(ours) as d:
        with pytest.raises(Refused, match=f"belongs to uid {OTHER_UID}"):
            d.read_bytes("f", 10)
        with pytest.raises(Refused, match=f"belongs to uid {OTHER_UID}"):
            d.subdir("sub")
    with pytest.raises(Refused, match=f"belongs to uid {OTHER_UID}"):
        SharedDir.open(link)
    assert (
        SharedDir.open(ours, Trust(owners=frozenset({os.geteuid(), OTHER_UID}))).read_bytes("f", 10) == b"x"
    )

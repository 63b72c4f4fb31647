"""The far end of a Unix socket from the kernel's socket diagnostics (osapi.unixdiag): the answer's
layout, and real sockets asked of the real kernel."""

from __future__ import annotations

import os
import socket
import struct
import tempfile
from pathlib import Path

from jobwarden.osapi.unixdiag import UnixDiag, UnixSocket, parse_answer
from tests.support import unavailable

# a real answer for an unnamed socket of a socketpair (inode 3740150, its peer 3740151), as this kernel
# sent it: nlmsghdr, unix_diag_msg, UNIX_DIAG_PEER, UNIX_DIAG_SHUTDOWN
ANSWER = bytes.fromhex(
    "300000001400000001000000490a000001010100f6113900041000000000000008000200f71139000500060000000000"
)


def test_an_answer_gives_the_sockets_peer() -> None:
    assert parse_answer(ANSWER) == UnixSocket(3740150, 3740151, "")


def test_an_answer_gives_a_bound_name_and_an_abstract_one_with_an_at() -> None:
    def named(raw: bytes) -> bytes:
        attr = struct.pack("=HH", 4 + len(raw), 0) + raw + b"\0" * (-len(raw) % 4)
        body = ANSWER[16:32] + attr
        return struct.pack("=IHHII", 16 + len(body), 20, 0, 1, 0) + body

    assert parse_answer(named(b"/run/feed.sock")).path == "/run/feed.sock"  # type: ignore[union-attr]
    assert parse_answer(named(b"\0feeder")).path == "@feeder"  # type: ignore[union-attr]


def test_an_error_or_a_short_answer_gives_nothing() -> None:
    error = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -2) + ANSWER[:16]  # NLMSG_ERROR, ENOENT
    assert parse_answer(error) is None
    assert parse_answer(ANSWER[:20]) is None
    assert parse_answer(b"") is None


def test_the_kernel_names_each_end_of_a_socketpair_and_a_connection() -> None:
    a, b = socket.socketpair()
    folder = Path(tempfile.mkdtemp(prefix="jw-diag-"))
    server = socket.socket(socket.AF_UNIX)
    client = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(folder / "s"))
        server.listen()
        client.connect(str(folder / "s"))
        accepted, _ = server.accept()
        with UnixDiag() as diag:
            mine = diag.ask(os.fstat(a.fileno()).st_ino)
            if mine is None:
                unavailable("the kernel's unix_diag (netlink NETLINK_SOCK_DIAG) does not answer")
            assert mine.peer == os.fstat(b.fileno()).st_ino and mine.path == ""
            mine = diag.ask(os.fstat(client.fileno()).st_ino)
            assert mine is not None and mine.peer == os.fstat(accepted.fileno()).st_ino
            peer = diag.ask(mine.peer)
            assert peer is not None and peer.path == str(folder / "s")  # an accepted end carries the path
            assert diag.ask(os.fstat(server.fileno()).st_ino) == UnixSocket(  # listening: no peer
                os.fstat(server.fileno()).st_ino, None, str(folder / "s")
            )
            with open(os.devnull, "rb") as not_a_socket:
                assert diag.ask(os.fstat(not_a_socket.fileno()).st_ino) is None
        accepted.close()
    finally:
        for s in (a, b, client, server):
            s.close()
        (folder / "s").unlink(missing_ok=True)
        folder.rmdir()

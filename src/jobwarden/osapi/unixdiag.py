"""The far end of a Unix domain socket, asked of the kernel's socket diagnostics (netlink NETLINK_SOCK_DIAG,
`unix_diag`): /proc/net/unix lists each socket's inode and path but not who it is connected to, and
`unix_diag` answers that (UNIX_DIAG_PEER) for any socket of this network namespace, without privilege.

One request per socket asked (never a dump of every socket), read-only, on a socket with a short timeout:
a kernel without `unix_diag` (a module not loaded, a container that cannot load it) answers with an error,
and the caller learns nothing rather than waiting.
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_UDIAG_SHOW_NAME, _UDIAG_SHOW_PEER = 0x1, 0x4
_UNIX_DIAG_NAME, _UNIX_DIAG_PEER = 0, 2
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: ask by inode alone
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_REQUEST = struct.Struct("=BBHIIIII")  # unix_diag_req: family, protocol, pad, states, inode, show, cookie
_MESSAGE = struct.Struct("=BBBBIII")  # unix_diag_msg: family, type, state, pad, inode, cookie
_ATTR = struct.Struct("=HH")  # rtattr: length, type
TIMEOUT_S = 0.2


@dataclass(frozen=True)
class UnixSocket:
    inode: int
    peer: int | None  # the inode of the socket it is connected to; None when not connected
    path: str  # its bound name ("@name" for an abstract one), "" for an unnamed socket


class UnixDiag:
    """A netlink socket to ask one Unix socket at a time. Unavailable (every answer None) when the kernel
    refuses it."""

    def __init__(self) -> None:
        try:
            self._sock: socket.socket | None = socket.socket(
                socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG
            )
            self._sock.settimeout(TIMEOUT_S)
        except OSError:
            self._sock = None
        self._seq = 0

    def __enter__(self) -> UnixDiag:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def ask(self, inode: int) -> UnixSocket | None:
        """The socket with this inode, or None (not a Unix socket, gone, or unix_diag unavailable)."""
        if self._sock is None:
            return None
        self._seq += 1
        request = _REQUEST.pack(
            socket.AF_UNIX,
            0,
            0,
            _ALL_STATES,
            inode,
            _UDIAG_SHOW_NAME | _UDIAG_SHOW_PEER,
            _NO_COOKIE,
            _NO_COOKIE,
        )
        header = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, self._seq, 0)
        try:
            self._sock.send(header + request)
            while True:
                answer = self._sock.recv(8192)
                if len(answer) < _HEADER.size:
                    return None
                if _HEADER.unpack_from(answer)[3] == self._seq:  # a late answer to an earlier question
                    return parse_answer(answer)
        except OSError as err:
            if err.errno in (errno.EPROTONOSUPPORT, errno.EINVAL, errno.ENOENT, errno.EPERM, errno.EACCES):
                self.close()  # the kernel has no unix_diag, or refuses it: no point asking again
            return None


def parse_answer(data: bytes) -> UnixSocket | None:
    """One netlink answer to a SOCK_DIAG_BY_FAMILY request: a unix_diag_msg and its attributes, or an
    error (the socket is gone) that gives None."""
    if len(data) < _HEADER.size:
        return None
    length, kind = _HEADER.unpack_from(data)[:2]
    data = data[: min(length, len(data))]
    if kind != _SOCK_DIAG_BY_FAMILY or len(data) < _HEADER.size + _MESSAGE.size:
        return None  # NLMSG_ERROR: ENOENT for an inode that is no Unix socket of this namespace
    inode = _MESSAGE.unpack_from(data, _HEADER.size)[4]
    peer, path = None, ""
    at = _HEADER.size + _MESSAGE.size
    while at + _ATTR.size <= len(data):
        size, kind = _ATTR.unpack_from(data, at)
        if size < _ATTR.size:
            break
        value = data[at + _ATTR.size : at + size]
        if kind == _UNIX_DIAG_PEER and len(value) >= 4:
            peer = struct.unpack_from("=I", value)[0] or None
        elif kind == _UNIX_DIAG_NAME and value:
            path = _shown_name(value)
        at += (size + 3) & ~3  # attributes are aligned to 4 bytes
    return UnixSocket(inode, peer, path)


def _shown_name(raw: bytes) -> str:
    """A bound name as `ss` shows it: an abstract one (a leading NUL) as "@name"."""
    if raw.startswith(b"\0"):
        return "@" + raw[1:].split(b"\0", 1)[0].decode("utf-8", "replace")
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

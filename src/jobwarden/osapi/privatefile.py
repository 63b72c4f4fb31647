"""A small secret of our own kept in the home (`web.token`): read without trusting what lies at its path,
written so that nobody else ever sees it, not even for a moment.

What is at the path may not be what we wrote. A symbolic link (to /dev/zero, or to another user's file),
a FIFO (opening it blocks until a writer comes), a device, a directory: each was once printed as the
token, hung the server, ate its memory or ended in an internal error. So the file is opened with
O_NOFOLLOW (the kernel refuses a link: no check-then-open race) and O_NONBLOCK (a FIFO opens at once),
judged on the opened descriptor with fstat (type, owner, mode, size), and read for a bounded number of
bytes only.

The general reader of files from shared places (group records) is a sibling of this one; this one is for
a private file of the user's own home, which may be replaced when it cannot be trusted.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from jobwarden.errors import OsApiError

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


class NotAFile(OsApiError):
    """Something other than a regular file is at the path: never read, and not ours to remove."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path} is {what}, not a regular file")
        self.path, self.what = path, what


class NotPrivate(OsApiError):
    """A regular file that cannot hold a secret of ours (another owner, others may read it, too large):
    its content is not returned; the caller may replace the file."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def read_private_file(path: Path, max_bytes: int) -> bytes:
    """The content of `path`: a regular file of this user's, mode 0600 or stricter, at most `max_bytes`.

    Raises FileNotFoundError when nothing is there, NotAFile for a link, FIFO, device, directory or
    socket, NotPrivate for a regular file that is not a private one of ours, and OSError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW on a symbolic link
            raise NotAFile(path, _KINDS[stat.S_IFLNK]) from None
        if err.errno in (errno.ENXIO, errno.ENODEV):  # a socket, a device without its driver: say which
            kind = stat.S_IFMT(os.lstat(path).st_mode)
            raise NotAFile(path, _KINDS.get(kind, f"a file of type {kind:o}")) from None
        raise
    try:
        st = os.fstat(fd)
        kind = stat.S_IFMT(st.st_mode)
        if kind != stat.S_IFREG:
            raise NotAFile(path, _KINDS.get(kind, f"a file of type {kind:o}"))
        if st.st_uid != os.geteuid():
            raise NotPrivate(path, f"it belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")
        if st.st_mode & 0o077:
            raise NotPrivate(path, f"others may read or write it (mode {stat.S_IMODE(st.st_mode):04o})")
        data = os.read(fd, max_bytes + 1)  # one byte more: a file that grew past its size is caught too
        if st.st_size > max_bytes or len(data) > max_bytes:
            raise NotPrivate(path, f"it is larger than {max_bytes} bytes")
        return data
    finally:
        os.close(fd)


def write_private_file(path: Path, data: bytes) -> None:
    """Replace `path` by a 0600 file holding `data`, atomically: written under a random name in the same
    directory (O_EXCL | O_NOFOLLOW: no planted name is followed) and renamed over `path` (a link at
    `path` is replaced, its target never touched)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

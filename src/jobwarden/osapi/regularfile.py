"""Reading a file the job writes in the run's own folder (its heartbeat, its bars' records, its adverts):
the job may put anything at that name. Light on purpose: `run` loads the shim, and the shim this, before
it answers."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_regular(path: Path, limit: int) -> bytes:
    """The first `limit` bytes of the regular file at `path`. A FIFO would block the supervisor in open()
    for good, a symlink lead it elsewhere: either raises OSError, as a file that is not there does."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"not a regular file: {path}")
        return read_at_most(fd, limit)
    finally:
        os.close(fd)


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd`, read until its end (a regular file may answer in parts)."""
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)

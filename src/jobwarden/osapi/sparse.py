"""Freeing the middle of a file that another process keeps appending to: fallocate(2) with
FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE. The blocks go back to the file system, the file keeps its
length and every offset its meaning (the range reads as zeros, and SEEK_DATA/SEEK_HOLE name it), and a
writer with O_APPEND goes on writing at the end, untouched. ext4, XFS, btrfs and tmpfs support it (Linux
>= 2.6.38 for ext4, 3.5 for tmpfs); NFS before 4.2, overlayfs on some lower file systems, and others
answer EOPNOTSUPP.

Not FALLOC_FL_COLLAPSE_RANGE: it would shift the bytes after the range, so every offset recorded so far
(the log's offset->time index, a follower's position, the web's byte cursors) would point elsewhere, and
ext4 and XFS only.
"""

from __future__ import annotations

import errno
import os

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free [offset, offset + length) of the file open for writing on `fd`; raises OSError (errno in
    UNSUPPORTED when the file system cannot)."""
    import ctypes  # only a shim that trims a log loads it

    libc = ctypes.CDLL(None, use_errno=True)
    fallocate = libc.fallocate64 if hasattr(libc, "fallocate64") else libc.fallocate
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fallocate.restype = ctypes.c_int
    if fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))

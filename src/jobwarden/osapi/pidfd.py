"""pidfds: a stable handle on a process, immune to pid reuse. Signals to job processes go through them.

`PIDFD_INFO_EXIT` (Linux >= 6.15) gives the wait status of a process we are not the parent of, provided a
pidfd on it was opened before it exited; before 6.15, /proc/PID/stat field 52 while it is a zombie.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import struct

from jobwarden.errors import AccessDenied, ProcessGone

_PIDFD_INFO_SIZE = 64  # struct pidfd_info, PIDFD_INFO_SIZE_VER0
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, ...)
_EXIT_CODE_OFFSET = 60


def open_pidfd(pid: int) -> int:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError as err:
        raise ProcessGone(pid) from err
    except PermissionError as err:  # pragma: no cover - pidfd_open needs no privilege today
        raise AccessDenied(pid, "watch") from err


def send_signal(pidfd: int, pid: int, sig: int) -> bool:
    """Signal through the pidfd. False if the process has already exited."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    except PermissionError as err:
        raise AccessDenied(
            pid,
            f"send {signal.Signals(sig).name} to",
            "it runs as another user (e.g. through sudo): rerun as root to end it",
        ) from err
    return True


def has_exited(pidfd: int) -> bool:
    """A pidfd polls readable once the process has exited (zombie or reaped)."""
    return bool(select.select([pidfd], [], [], 0)[0])


def exit_status(pidfd: int) -> int | None:
    """The wait status of an exited, *reaped* process we did not parent; None when not (yet) known."""
    buf = bytearray(struct.pack("Q", _PIDFD_INFO_EXIT) + bytes(_PIDFD_INFO_SIZE - 8))
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf, True)  # the kernel fills `buf` in place
    except OSError as err:
        if err.errno in (errno.ENOTTY, errno.EINVAL, errno.ESRCH, errno.EOPNOTSUPP):
            return None  # kernel < 6.13/6.15, or not exited yet
        raise
    (mask,) = struct.unpack_from("Q", buf, 0)
    if not mask & _PIDFD_INFO_EXIT:
        return None
    return int(struct.unpack_from("i", buf, _EXIT_CODE_OFFSET)[0])


def close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)

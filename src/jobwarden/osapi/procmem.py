"""Reading a few bytes of a live process's memory, through /proc/PID/mem: read-only, and allowed only where
ptrace would be (the same check the kernel makes for py-spy, which the hang's dump already passed).

Nothing is written, nothing is paused: a read of a process that runs meanwhile may see a half-updated
object, which is why every caller validates what it reads (probes.rlocks). Reads are capped at
MAX_READ bytes; an address the process has no mapping at reads as nothing (EIO), never as an error.
"""

from __future__ import annotations

import errno
import os

from jobwarden.errors import AccessDenied, ProcessGone

MAX_READ = 256


class ProcessMemory:
    """One process's memory, open for reading until closed (`with ProcessMemory(pid) as mem:`)."""

    def __init__(self, pid: int, proc: str = "/proc") -> None:
        self.pid = pid
        try:
            self._fd = os.open(f"{proc}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as err:
            raise ProcessGone(pid) from err
        except PermissionError as err:
            raise AccessDenied(pid, "read the memory of") from err
        except OSError as err:
            if err.errno == errno.ESRCH:
                raise ProcessGone(pid) from err
            raise AccessDenied(pid, "read the memory of") from err

    def read(self, address: int, size: int) -> bytes:
        """Up to `size` (at most MAX_READ) bytes at `address`; b"" where nothing is mapped or the address
        is not one (negative, past the user space)."""
        if address <= 0 or size <= 0 or address >= 1 << 63:
            return b""
        try:
            return os.pread(self._fd, min(size, MAX_READ), address)
        except OSError as err:
            if err.errno in (errno.EIO, errno.EFAULT, errno.EINVAL, errno.EOVERFLOW):
                return b""
            if err.errno == errno.ESRCH:
                raise ProcessGone(self.pid) from err
            raise AccessDenied(self.pid, "read the memory of") from err

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

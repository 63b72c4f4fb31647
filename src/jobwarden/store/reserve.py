"""Room kept on the database's disk for a run's end.

A job that fills the disk under JOBWARDEN_HOME fills it for its shim too: the end of the run could never
be written, and the run stayed `running` for ever with its main process dead. Each shim keeps a small
file beside the database, allocated while there is room (posix_fallocate: the blocks are the file's, not
a promise), and deletes it the moment the store refuses the end for want of space: the end, and the
disk-full episode that explains it, fit in what it frees. Deleted at the end of the run in any case.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

RESERVE_BYTES = 2 << 20  # the end's few pages and the events before it, many times over


def reserve_path(database: Path, job_id: int, run: int) -> Path:
    return database.with_name(f".{database.name}.reserve-{job_id}-{run}")


class SpaceReserve:
    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path, self.size = path, size
        self.kept = False

    def keep(self) -> bool:
        """Allocate the reserve (or take over the one an earlier shim of this run left); False when there
        is no room for it already, or it cannot be made safely (a link planted under its name)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            os.posix_fallocate(fd, 0, self.size)
        except OSError:
            with contextlib.suppress(OSError):
                self.path.unlink()  # a partial reserve frees what it holds now
            return False
        finally:
            os.close(fd)
        self.kept = True
        return True

    def release(self) -> bool:
        """Free the room; True when there was a reserve to free."""
        self.kept = False
        try:
            self.path.unlink()
        except OSError:  # none (FileNotFoundError), or not ours to remove
            return False
        return True

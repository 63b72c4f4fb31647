"""The exception tree. Every error a user can meet carries what happened, what to do, and an exit code."""

from __future__ import annotations


class JobwardenError(Exception):
    """Base of every error jobwarden reports to a user."""

    exit_code = 1

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.message} ({self.remedy})" if self.remedy else self.message


class UsageError(JobwardenError):
    exit_code = 2


class Interrupted(JobwardenError):
    """Ctrl-C: the shell's status for SIGINT."""

    exit_code = 130


class JobNotFound(JobwardenError):
    def __init__(self, ref: str) -> None:
        if ref == "@last":  # store.jobs.LAST_JOB: asked for the newest job of a home that has none
            super().__init__("no job yet in this jobwarden home", "start one: jobwarden run -- COMMAND")
        else:
            super().__init__(f"no job {ref!r}", "list jobs with `jobwarden ps --all`")


class CommandNotFound(JobwardenError):
    exit_code = 127


class CommandNotExecutable(JobwardenError):
    exit_code = 126


class StoreError(JobwardenError):
    """The state directory or database cannot be used."""


class StoreCorrupt(StoreError):
    pass


class StoreFull(StoreError):
    """The file system holding the database has no room for the write."""


class StoreBusy(StoreError):
    """Another process holds the database's write lock past the time this write would wait."""


class JobStillRunning(JobwardenError):
    pass


class ShimStartFailed(JobwardenError):
    pass


class ShimExited(ShimStartFailed):
    """The shim ended before it reported: it never started the job (unlike a shim that is slow)."""


class OsApiError(JobwardenError):
    """Low-level OS failures translated once at the osapi boundary."""


class ProcessGone(OsApiError):
    def __init__(self, pid: int) -> None:
        super().__init__(f"process {pid} is gone")
        self.pid = pid


class AccessDenied(OsApiError):
    def __init__(self, pid: int, what: str, remedy: str = "") -> None:
        super().__init__(f"not allowed to {what} process {pid}", remedy)
        self.pid = pid

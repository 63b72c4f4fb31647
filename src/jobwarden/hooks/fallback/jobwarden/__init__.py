"""A stand-in `jobwarden` for interpreters that do not have it installed: only `heartbeat`.

jobwarden's Python hooks append this directory's parent to the END of sys.path, so `import jobwarden;
jobwarden.heartbeat(step=3)` works in any Python process of a job while an installed jobwarden still wins.
Runs in the job's interpreter (CPython 3.8-3.14): standard library only, 3.8 syntax."""

from __future__ import annotations

import os
import time

__all__ = ["heartbeat"]

_HEARTBEAT_FILE_ENV = "JOBWARDEN_HEARTBEAT_FILE"
_MIN_INTERVAL_S = 0.5
_RANK_SUFFIX = ".rank"  # JOBWARDEN_HEARTBEAT_FILE + ".rank" + RANK: where a rank's own beat goes
# the launchers' global rank, the first one set (as jobwarden.model.ranks_from reads it)
_RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def heartbeat(**info: object) -> None:
    """Tell jobwarden the job makes progress, with what it likes to show (`step=3, loss=0.5`).

    Writes {"at": <unix time>, "info": {...}} atomically to the file named by JOBWARDEN_HEARTBEAT_FILE, where
    jobwarden reads it; does nothing outside a job. Cheap enough for every step: at most one write per 0.5 s,
    the latest info written by the next call after that (or at exit). Never raises into the job.

    This is the copy for interpreters without jobwarden; it must behave as jobwarden.heartbeat does (a test
    runs the same cases on both)."""
    try:  # noqa: SIM105 (contextlib would cost the job an import)
        _beats.beat(info)
    except Exception:
        pass


class _Beats:
    """The rate limit. No lock: a race costs one extra write at worst, and a lock held by another thread
    when the job forks would hang the child's first heartbeat."""

    def __init__(self) -> None:
        self.written_at = float("-inf")  # monotonic
        self.pending: tuple[float, dict[str, object]] | None = None
        self.flush_at_exit = False

    def beat(self, info: dict[str, object]) -> None:
        if not os.environ.get(_HEARTBEAT_FILE_ENV):
            return
        now = time.monotonic()
        self.pending = (time.time(), info)
        if now - self.written_at < _MIN_INTERVAL_S:
            if not self.flush_at_exit:
                import atexit

                atexit.register(self.flush)
                self.flush_at_exit = True
            return
        self.written_at = now
        self.flush()

    def flush(self) -> None:
        pending, self.pending = self.pending, None
        path = os.environ.get(_HEARTBEAT_FILE_ENV)
        if pending is None or not path:
            return
        try:
            _write_heartbeat(path, *pending)
            rank = next((os.environ[v] for v in _RANK_VARIABLES if os.environ.get(v)), "")
            if rank.isdigit():  # a rank of a distributed job: its own step too, beside the job's
                _write_heartbeat(f"{path}{_RANK_SUFFIX}{rank}", *pending)
        except Exception:
            pass


def _write_heartbeat(path: str, at: float, info: dict[str, object]) -> None:
    import json

    text = json.dumps({"at": at, "info": info}, default=_plain)
    tmp = f"{path}.{os.getpid()}.tmp"  # one per process: ranks of a job may share the file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _plain(value: object) -> object:
    """numpy scalars and one-element tensors as numbers; anything else as (the start of) its str()."""
    try:
        return float(value)  # type: ignore[arg-type]
    except Exception:
        return str(value)[:200]


_beats = _Beats()

"""Part of jobwarden's Python hooks (_jobwarden_hooks.py): the records of exceptions, loaded into the hooks'
namespace (`load_part`) the first time a process needs them: as it dies of an uncaught exception, or once it
imports `traceback` (which formats the exceptions it survives). A process that never does pays nothing for
them at start-up. The hooks' rules hold: standard library only, 3.8 syntax, never break the job.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: at run time these are the hooks' own globals, this part runs among them
    from types import ModuleType

    from jobwarden.hooks.site._jobwarden_hooks import (
        ERROR_FILE_ENV,
        FRAMES_PER_THREAD,
        _append,
        _Job,
        _job,
        _record_rank,
        _report,
        _start_time,
        _write_atomic,
        dumps,
    )


# --- the first uncaught exception ----------------------------------------------------------------------

MESSAGE_CHARS = 4000
CHAINED = 5


def trim(text: str, limit: int = MESSAGE_CHARS) -> str:
    """At most `limit` characters: a long message's start and its end, where a relayed traceback (a
    worker's, inside its parent's exception) ends with the exception that started it all."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text)} characters, cut ...]\n"
    head = limit // 4
    return text[:head] + marker + text[len(text) - (limit - head - len(marker)) :]


def _qualified(kind: type) -> str:
    module = getattr(kind, "__module__", "") or ""
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in ("builtins", "__main__") else f"{module}.{name}"


def _traceback_frames(tb: object) -> list[dict[str, object]]:
    """Innermost first, like every stack jobwarden keeps."""
    found: list[dict[str, object]] = []
    while tb is not None:
        code = tb.tb_frame.f_code  # type: ignore[attr-defined]
        found.append(
            {
                "function": getattr(code, "co_qualname", code.co_name),
                "file": code.co_filename,
                "line": tb.tb_lineno,  # type: ignore[attr-defined]
            }
        )
        tb = tb.tb_next  # type: ignore[attr-defined]
    return found[::-1][:FRAMES_PER_THREAD]


def exception_record(exc: BaseException, at: float, pid: int, start_time: int) -> dict[str, object]:
    chain: list[dict[str, object]] = []
    inner: BaseException | None = exc
    while inner is not None and len(chain) < CHAINED:
        inner = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
        if inner is None:
            break
        chain.append({"type": _qualified(type(inner)), "message": trim(str(inner))})
    return {
        "pid": pid,
        "start_time": start_time,
        "at": at,
        "type": _qualified(type(exc)),
        "message": trim(str(exc)),
        "frames": _traceback_frames(exc.__traceback__),
        "chain": chain,
        "rank": _record_rank(),
        "executable": sys.executable or None,  # a missing module is missing for this interpreter
    }


def _torchelastic_error(exc: BaseException, at: float) -> str:
    """What torch.distributed.elastic's @record writes (ErrorHandler.record_exception), so that the
    agent's ChildFailedError report carries the rank's traceback instead of `error_file: <N/A>`."""
    import traceback  # only on the way out of a failing process

    return dumps(
        {
            "message": {
                "message": f"{type(exc).__name__}: {exc}",
                "extraInfo": {
                    "py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                    "timestamp": str(int(at)),
                },
            }
        }
    )


def _record_exception(job: _Job, exc: BaseException) -> None:
    if job.exception_seen:
        return
    job.exception_seen = True
    at, pid = time.time(), os.getpid()
    _write_atomic(job.path(pid, ".exc.json"), dumps(exception_record(exc, at, pid, _start_time())))
    error_file = os.environ.get(ERROR_FILE_ENV)
    # torchrun gives each rank its own file; a child of the rank inherits the variable but is not the
    # rank: only the process torchrun started (the one that saw the variable at start-up, not a fork)
    if error_file and job.error_file_owner == pid and not os.path.exists(error_file):
        _write_atomic(error_file, _torchelastic_error(exc, at))


# --- exceptions formatted without dying of them --------------------------------------------------------

CAUGHT_RECORDS = 32  # per process: a job that logs an exception in a loop must not fill the disk
CAUGHT_MESSAGE_CHARS = 1000
CAUGHT_FRAMES = 20


def record_caught(job: _Job, kind: object, exc: object, tb: object) -> None:
    """One line of `<pid>.caught.jsonl` for an exception this process formats (traceback's
    TracebackException: format_exception, format_exc, print_exc, logging's exception()). A worker that
    sends its task's exception to its parent formats it first (multiprocessing.pool, concurrent.futures,
    loky, torch's DataLoader and spawn all do): the parent's re-raise then carries this text, and the
    record names the process where it was raised. What the process prints as it dies is recorded too."""
    if job.caught >= CAUGHT_RECORDS or job.recording or tb is None or not isinstance(exc, BaseException):
        return
    job.recording = True
    try:
        job.caught += 1
        pid = os.getpid()
        record = {
            "pid": pid,
            "at": time.time(),
            "type": _qualified(kind if isinstance(kind, type) else type(exc)),
            "message": trim(str(exc), CAUGHT_MESSAGE_CHARS),
            "frames": _traceback_frames(tb)[:CAUGHT_FRAMES],
            "rank": _record_rank(),
        }
        _append(job.path(pid, ".caught.jsonl"), dumps(record))
    finally:
        job.recording = False


def hook_traceback(module: ModuleType) -> None:
    """Record every exception `traceback` formats: the outermost TracebackException of each formatting
    (the exceptions chained to it are built with `_seen` set, 3.8-3.14)."""
    cls = module.TracebackException
    original = cls.__init__
    if getattr(original, "_jobwarden", False):
        return

    def __init__(
        self: object,
        exc_type: object,
        exc_value: object,
        exc_traceback: object,
        *args: object,
        **kwargs: object,
    ) -> None:
        original(self, exc_type, exc_value, exc_traceback, *args, **kwargs)
        job = _job
        if job is not None and kwargs.get("_seen") is None:
            try:
                record_caught(job, exc_type, exc_value, exc_traceback)
            except Exception as err:  # a record must never change what the job formats
                _report(job, "caught exception record", err)

    __init__._jobwarden = True  # type: ignore[attr-defined]
    cls.__init__ = __init__

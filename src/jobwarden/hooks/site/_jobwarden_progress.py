"""Part of jobwarden's Python hooks (_jobwarden_hooks.py): the job's progress bars, read in-process, loaded
into the hooks' namespace (`load_part`) the first time a process imports a module with bars
(PROGRESS_MODULES). A process without bars pays nothing for them at start-up. The hooks' rules hold:
standard library only, 3.8 syntax, never break the job.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: at run time these are the hooks' own globals, this part runs among them
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from jobwarden.hooks.site._jobwarden_hooks import (
        _Job,
        _job,
        _rank,
        _report,
        dumps,
        file_id,
    )


# --- progress bars, read in-process (tqdm, Keras, rich) ------------------------------------------------
#
# The counters of the job's bars, exact, without parsing its output: each hooked class writes what this
# process's bars show to `<py_dir>/<pid>.progress` (the shim reads it), at most every PROGRESS_EVERY_S and
# when a bar closes or a new one appears. The modules are hooked as they are first imported (AfterImport):
# nothing is imported here, and a job without bars pays one dict lookup per import. Each wrapper calls the
# library first and swallows its own failures: a bar must never break the job. tqdm's refresh() runs when
# the bar is redrawn (at most every mininterval, 0.1 s by default; __iter__ does not call it per item), so
# the cost of a tight loop does not change.

# tqdm's own mininterval: each redraw of a default bar is recorded, and a loop that stops right after a
# burst of fast steps leaves its record at most this far behind (no timer writes the last state later).
# A write costs an inode (the temporary file renamed over the record), 1.2-1.9 ms measured on ext4: at 10
# a second, 1-2 % of a core (5-8 % of a job held to a quarter of a CPU). The checks before it are O(1).
PROGRESS_EVERY_S = 0.1
MAX_BARS = 16
TEXT_CHARS = 200


class _Bars:
    """This process's bars, as the hooks last saw them."""

    def __init__(self) -> None:
        self.written = -1e9  # monotonic time of the last record
        self.unwritten = False  # a bar moved since the last record: written at exit if nothing came after
        self.exit_hook = False  # _progress_left registered with atexit
        self.tqdm: Any = None  # tqdm.std.tqdm once hooked: its live bars are in tqdm._instances
        self.closed: dict[str, object] | None = None  # the bar closed last, as it ended
        self.keras: Any = None  # the Keras Progbar updated last
        self.rich: Any = None  # the rich Progress updated last
        self.epoch: int | None = None  # the epoch Keras' ProgbarLogger began (1-based, as it prints)
        self.known: dict[int, None] = {}  # ids of the last bars written (32), oldest first: a new one is
        # written at once
        self.fd = -1  # `<pid>.progress`, kept open by the process that opened it (fd_pid)
        self.fd_id: tuple[int, int] | None = None  # its (st_dev, st_ino)
        self.fd_pid = 0
        self.length = 0  # bytes in the file: a shorter record is padded over it

    def is_new(self, bar: object) -> bool:
        """A bar not written yet (a new epoch's bar): its first state is worth a write at once. O(1): it
        runs at every redraw of every bar."""
        key = id(bar)
        if key in self.known:
            return False
        self.known[key] = None
        if len(self.known) > 32:
            del self.known[next(iter(self.known))]
        return True


_bars = _Bars()


def _progress_seen(force: bool = False) -> None:
    """A hooked bar moved: write the record, unless one was written less than PROGRESS_EVERY_S ago."""
    job = _job
    if job is None:
        return
    try:
        now = time.monotonic()
        if not force and now - _bars.written < PROGRESS_EVERY_S:
            if not _bars.unwritten:
                _bars.unwritten = True
                _flush_progress_at_exit()
            return
        _bars.written, _bars.unwritten = now, False
        _write_progress(job, _bars, dumps(progress_record(_bars, time.time())).encode())
    except Exception as err:
        _report(job, "progress record", err)


def _flush_progress_at_exit() -> None:
    """The bars' last state, at exit: a fit whose last steps all come within PROGRESS_EVERY_S of a record
    (Lightning's rich bar through a small model's last epoch) would otherwise end at a step it passed."""
    if _bars.exit_hook:
        return
    _bars.exit_hook = True
    import atexit  # built in

    atexit.register(_progress_left)


def _progress_left() -> None:
    if _bars.unwritten and _bars.fd_pid == os.getpid():  # a forked child: its parent's bars, not its own
        _progress_seen(force=True)


def _write_progress(job: _Job, bars: _Bars, text: bytes) -> None:
    """The record, rewritten in place: one pwrite() on a descriptor kept open (checked to be still the
    record: the job may close it and reuse the number), padded with spaces over a longer previous record
    (JSON allows them). A temporary file renamed over it cost an inode a write, 1.2-1.9 ms measured on
    ext4, ten times a second. A reader that meets a write half done fails to parse it (or, for a write of
    the same length, reads a mix of two states a tenth of a second apart) and reads again at its next tick."""
    fd = bars.fd
    if fd >= 0 and (bars.fd_pid != job.pid or file_id(fd) != bars.fd_id):
        if bars.fd_pid != job.pid and file_id(fd) == bars.fd_id:
            os.close(fd)  # a forked child's copy of its parent's: its own record is another file
        fd = bars.fd = -1
    if fd < 0:
        path = job.path(job.pid, ".progress")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        bars.fd, bars.fd_id, bars.fd_pid, bars.length = fd, file_id(fd), job.pid, os.fstat(fd).st_size
    os.pwrite(fd, text + b" " * (bars.length - len(text)), 0)
    bars.length = max(bars.length, len(text))


def progress_record(bars: _Bars, at: float) -> dict[str, object]:
    found: list[dict[str, object]] = []
    if bars.tqdm is not None:
        try:
            live = list(bars.tqdm._instances)  # a WeakSet another thread may change: retried next time
        except Exception:
            live = []
        found += [e for e in (_tqdm_bar(bar, False) for bar in live[:MAX_BARS]) if e is not None]
    if bars.closed is not None:
        found.append(bars.closed)
    if bars.keras is not None:
        found += [e for e in (_keras_bar(bars.keras),) if e is not None]
    if bars.rich is not None:
        found += _rich_bars(bars.rich)
    rank = _rank()
    return {
        "pid": os.getpid(),
        "rank": int(rank) if rank != "-" else None,
        "at": at,
        "bars": found[:MAX_BARS],
        "epoch": bars.epoch,
    }


def _text(value: object) -> str | None:
    return value[:TEXT_CHARS] if isinstance(value, str) else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return int(value) if abs(value) < 1e18 else None


def _tqdm_bar(bar: Any, closed: bool) -> dict[str, object] | None:
    n = _count(getattr(bar, "n", None))  # a bar another thread is still building has no n yet
    if n is None:
        return None
    return {
        "kind": "tqdm",
        "n": n,
        "total": _count(getattr(bar, "total", None)),
        "unit": _text(getattr(bar, "unit", None)),
        "desc": _text(getattr(bar, "desc", None)),
        "pos": abs(_count(getattr(bar, "pos", 0)) or 0),
        "closed": closed,
        "postfix": _text(getattr(bar, "postfix", None)),
    }


def _keras_bar(bar: Any) -> dict[str, object] | None:
    n = _count(getattr(bar, "_seen_so_far", None))
    if n is None:
        return None
    total = _count(getattr(bar, "target", None))
    metrics = {}
    values: Any = getattr(bar, "_values", None) or {}
    for name in list(getattr(bar, "_values_order", None) or [])[:MAX_BARS]:
        try:
            summed, count = values[name]
            metrics[str(name)[:40]] = float(summed) / max(float(count), 1.0)
        except Exception:  # a tensor, a value of another shape: that metric is left out
            continue
    return {
        "kind": "keras",
        "n": n,
        "total": total,
        "unit": _text(getattr(bar, "unit_name", "step")),
        "desc": None,
        "pos": 0,
        "closed": total is not None and n >= total,
        "metrics": metrics,
    }


def _rich_bars(progress: Any) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    try:
        tasks = list(progress.tasks)[:MAX_BARS]
        metrics = _rich_metrics(progress)
    except Exception:
        return found
    for task in tasks:
        n = _count(getattr(task, "completed", None))
        if n is None or not getattr(task, "visible", True):
            continue
        desc = _text(getattr(task, "description", None))
        found.append(
            {
                "kind": "rich",
                "n": n,
                "total": _count(getattr(task, "total", None)),
                "unit": None,
                "desc": _unmarked(desc) if desc else None,
                "pos": len(found),
                "closed": bool(getattr(task, "finished", False)),
                "metrics": metrics,
            }
        )
    return found


def _rich_metrics(progress: Any) -> dict[str, float]:
    """Lightning's RichProgressBar shows its metrics in a column that keeps them in `_metrics`."""
    for column in getattr(progress, "columns", ()):
        found = getattr(column, "_metrics", None)
        if isinstance(found, dict):
            return {str(k)[:40]: float(v) for k, v in list(found.items())[:MAX_BARS] if _is_number(v)}
    return {}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unmarked(text: str) -> str:
    """A rich description without its markup: "[bold]Epoch 3" -> "Epoch 3"."""
    out, depth = [], 0
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]" and depth:
            depth -= 1
        elif not depth:
            out.append(c)
    return "".join(out).strip()


def _hook_tqdm(module: ModuleType) -> None:
    cls = getattr(module, "tqdm", None)
    if cls is None or getattr(cls, "_jobwarden_hooked", False):
        return
    refresh, close = cls.refresh, cls.close

    def refresh_seen(self: Any, *args: Any, **kwargs: Any) -> Any:
        shown = refresh(self, *args, **kwargs)
        if _job is not None:
            _progress_seen(force=_bars.is_new(self))
        return shown

    def close_seen(self: Any, *args: Any, **kwargs: Any) -> Any:
        was_open = not getattr(self, "disable", True)
        result = close(self, *args, **kwargs)
        if was_open and _job is not None:
            try:
                _bars.closed = _tqdm_bar(self, True)
            except Exception:  # at interpreter shutdown (close from __del__) anything may be gone
                return result
            _progress_seen(force=True)
        return result

    cls.refresh, cls.close = refresh_seen, close_seen
    cls._jobwarden_hooked = True
    _bars.tqdm = cls


def _hook_progbar(module: ModuleType) -> None:
    cls = getattr(module, "Progbar", None)
    if cls is None or getattr(cls, "_jobwarden_hooked", False):
        return
    update = cls.update

    def update_seen(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = update(self, *args, **kwargs)
        if getattr(self, "verbose", 1) and _job is not None:
            _bars.keras = self
            target = getattr(self, "target", None)
            done = target is not None and getattr(self, "_seen_so_far", 0) >= target
            _progress_seen(force=done or _bars.is_new(self))
        return result

    cls.update = update_seen
    cls._jobwarden_hooked = True


def _hook_progbar_logger(module: ModuleType) -> None:
    cls = getattr(module, "ProgbarLogger", None)
    if cls is None or getattr(cls, "_jobwarden_hooked", False):
        return
    begin = cls.on_epoch_begin

    def on_epoch_begin_seen(self: Any, epoch: int, *args: Any, **kwargs: Any) -> Any:
        _bars.epoch = _count(epoch + 1) if _is_number(epoch) else None
        return begin(self, epoch, *args, **kwargs)

    cls.on_epoch_begin = on_epoch_begin_seen
    cls._jobwarden_hooked = True


def _hook_rich(module: ModuleType) -> None:
    cls = getattr(module, "Progress", None)
    if cls is None or getattr(cls, "_jobwarden_hooked", False):
        return
    for name in ("update", "advance"):
        setattr(cls, name, _rich_wrapper(getattr(cls, name)))
    cls._jobwarden_hooked = True


def _rich_wrapper(method: Callable[..., Any]) -> Callable[..., Any]:
    def seen(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if _job is not None:
            _bars.rich = self
            _progress_seen()
        return result

    return seen

"""Is a thread waiting on a lock (a mutex someone holds), rather than for data or for time?

Three grades of evidence, strongest first:
- native frames: the lock entry points of CPython and glibc (`lock_PyThread_acquire_lock`, `rlock_acquire`,
  `__lll_lock_wait`, `pthread_mutex_lock`, `take_gil`) or the interpreter's own after-fork lock
  (`PyOS_AfterFork_Child`, gh-112275). `PyThread_acquire_lock_timed` alone is not enough: queue.SimpleQueue
  and Condition.wait park on it too;
- a Python frame that takes a lock written in Python (`Handler.acquire` in logging, importlib's
  `_ModuleLock.acquire`, `_acquireLock`);
- a Python-only stack of a single idle thread whose kernel wait channel is a futex, where the innermost
  frame is the job's code (a `with lock:` line: the acquire is C, so py-spy shows only that line).

Waits that look like lock waits but are not, because the waker is alive and expected to come: condition and
event waits, thread joins, queue gets, and multiprocessing's SemLock (shared with other processes, held by a
live sibling: a pool worker idles there while another reads the task queue).
"""

from __future__ import annotations

from dataclasses import dataclass

from jobwarden.observations import Frame, ProcessFacts, ThreadStack
from jobwarden.rules import frames

_NATIVE_LOCK_ENTRIES = (
    "lock_PyThread_acquire_lock",  # threading.Lock.acquire / `with lock:`
    "rlock_acquire",  # threading.RLock
    "lll_lock_wait",  # glibc mutex slow path (__lll_lock_wait)
    "pthread_mutex_lock",
    "pthread_rwlock_",
    "take_gil",  # waiting for the GIL
    "PyOS_AfterFork_Child",  # the interpreter's own locks after fork (gh-74580, gh-112275)
    "_PyImport_AcquireLock",
    "PyMutex_Lock",  # 3.13's internal mutex
)
# (file suffix, bare function names) of Python-level waits whose waker is alive: not lock waits
_NOT_LOCK_WAITS = (
    ("threading.py", {"wait", "join", "_wait_for_tstate_lock", "get"}),
    ("queue.py", {"get", "put"}),
    ("queues.py", {"get", "put"}),
    ("multiprocessing/synchronize.py", {"__enter__", "acquire", "wait"}),
    ("multiprocessing/connection.py", {"wait", "_recv", "recv", "recv_bytes", "_recv_bytes", "poll"}),
    ("selectors.py", {"select"}),
)
_PY_LOCK_NAMES = {"acquire", "_acquireLock", "_acquire_lock", "__enter__"}


@dataclass(frozen=True)
class LockWait:
    thread: ThreadStack
    at: Frame | None  # the Python frame that waits (None when the stack has no Python frame)
    how: str  # the evidence, for the finding: "native frame lock_PyThread_acquire_lock (libpython3.11.so)"
    after_fork: bool = False  # stuck inside the interpreter's after-fork code: a fork proved by the stack


def lock_wait(thread: ThreadStack, facts: ProcessFacts | None = None, threads: int = 1) -> LockWait | None:
    """How `thread` waits on a lock, or None. `threads` is how many threads its process has: the futex
    grade only applies to a lone thread (with several, a futex wait may be the GIL or a condition)."""
    if thread.active:
        return None
    py = frames.python_frames(thread)
    innermost = py[0] if py else None
    if innermost is not None and _is_not_lock_wait(innermost):
        return None
    native = _native_lock_entry(thread)
    if native is not None:
        after_fork = "AfterFork" in native.function
        return LockWait(thread, innermost, f"native frame {frames.where(native)}", after_fork)
    if innermost is not None and frames.name(innermost) in _PY_LOCK_NAMES:
        return LockWait(thread, innermost, f"Python frame {frames.where(innermost)}")
    if _futex_wait(thread, facts, threads) and innermost is not None and not frames.is_library(innermost):
        wchan = facts.wchan if facts else "futex"
        return LockWait(thread, innermost, f"the kernel shows it asleep on a futex (wchan {wchan})")
    return None


def _native_lock_entry(thread: ThreadStack) -> Frame | None:
    """A lock entry point among the native frames above the innermost Python frame."""
    for frame in thread.frames:
        if not frame.native:
            return None
        if any(entry in frame.function for entry in _NATIVE_LOCK_ENTRIES):
            return frame
    return None


def _is_not_lock_wait(frame: Frame) -> bool:
    bare = frames.name(frame)
    return any(frames.is_in(frame, suffix) and bare in names for suffix, names in _NOT_LOCK_WAITS)


def _futex_wait(thread: ThreadStack, facts: ProcessFacts | None, threads: int) -> bool:
    if facts is None or threads != 1 or thread.active is not False:
        return False
    return facts.state == "S" and (facts.wchan or "").startswith("futex")

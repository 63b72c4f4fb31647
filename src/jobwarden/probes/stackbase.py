"""What every way of capturing stacks shares: the kernel's view of a process's threads (read before any
tool touches it), a deadline, and the one exception a capture method raises when it cannot deliver."""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass, field

from jobwarden.errors import ProcessGone
from jobwarden.osapi.procfs import ProcFS, parse_stat

STOPPED_STATES = frozenset("Tt")  # job-control stop, tracing stop


class Failure(enum.Enum):
    """Why a method gave no stack; the kind decides what is tried next."""

    NOT_PYTHON = "not-python"  # try gdb
    DENIED = "denied"  # ptrace refused: try what needs no ptrace
    GONE = "gone"  # exited meanwhile: nothing more to try
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"  # the tool is not installed
    FAILED = "failed"  # anything else


class CaptureError(Exception):
    def __init__(self, kind: Failure, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Deadline:
    """An absolute point on the monotonic clock, shared by every step of one capture."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def share(self, fraction: float) -> float:
        """Part of what is left, for a step that must leave time for a fallback after it."""
        return self.remaining() * fraction

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0


@dataclass(frozen=True)
class TaskView:
    """The threads of one process as the kernel reports them, read before any tool attaches."""

    pid: int
    start_time: int
    process_state: str
    states: dict[int, str] = field(default_factory=dict)  # tid -> R S D T t Z ...
    names: dict[int, str] = field(default_factory=dict)  # tid -> comm

    @property
    def in_d_state(self) -> list[int]:
        return sorted(tid for tid, s in self.states.items() if s == "D")

    @property
    def stopped(self) -> bool:
        """Stopped by job control (SIGSTOP/SIGTSTP/SIGTTIN/SIGTTOU) or held by a tracer."""
        return self.process_state in STOPPED_STATES or any(s in STOPPED_STATES for s in self.states.values())

    @property
    def may_block(self) -> bool:
        """May a tool pause this process? Not with a thread in D state (the pause waits for ever and
        freezes the other threads meanwhile), nor when it is stopped (py-spy's pause fails, and a signal
        meant to make it dump would wait until someone continues it)."""
        return not self.in_d_state and not self.stopped


def read_tasks(procfs: ProcFS, pid: int) -> TaskView:
    """The state and name of every thread of `pid`. Raises ProcessGone (or AccessDenied)."""
    st = procfs.stat(pid)
    if st.state in ("Z", "X"):
        raise ProcessGone(pid)
    task_dir = procfs.root / str(pid) / "task"
    try:
        tids = os.listdir(task_dir)
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessGone(pid) from err
    states, names = {}, {}
    for tid in tids:
        try:
            with open(task_dir / tid / "stat") as fh:
                tst = parse_stat(fh.read())
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue  # a thread that ended while we looked
        states[int(tid)] = tst.state
        names[int(tid)] = tst.comm
    return TaskView(pid, st.start_time, st.state, states, names)


def thread_wchan(procfs: ProcFS, pid: int, tid: int) -> str | None:
    """The kernel function a thread sleeps in (what a D-state thread waits for), when readable."""
    try:
        with open(procfs.root / str(pid) / "task" / str(tid) / "wchan") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return text if text and text != "0" else None


def describe_d_state(procfs: ProcFS, tasks: TaskView) -> str:
    parts = []
    for tid in tasks.in_d_state:
        wchan = thread_wchan(procfs, tasks.pid, tid)
        parts.append(f"{tid} (in {wchan})" if wchan else str(tid))
    return "thread " + ", ".join(parts) + " in uninterruptible sleep (D)"


def ptrace_denied_help(procfs: ProcFS, pid: int) -> str:
    """Name what refused ptrace and the fix: Yama's ptrace_scope, or a missing CAP_SYS_PTRACE."""
    scope_file = procfs.root / "sys" / "kernel" / "yama" / "ptrace_scope"
    try:
        scope = int(scope_file.read_text().strip())
    except (OSError, ValueError):
        scope = None
    if scope == 3:
        return (
            f"ptrace of process {pid} denied: Yama ptrace_scope=3 forbids it for everyone until reboot; "
            "nothing but the Python hook's faulthandler dump can help"
        )
    if scope in (1, 2):
        who = "its ancestors (or a tracer it named with PR_SET_PTRACER)" if scope == 1 else "CAP_SYS_PTRACE"
        return (
            f"ptrace of process {pid} denied: Yama ptrace_scope={scope} ({scope_file}) lets only {who} "
            "attach; fix: run as root, or `sudo sysctl kernel.yama.ptrace_scope=0`, or give the tool "
            "CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE)"
        )
    return (
        f"ptrace of process {pid} denied: it runs as another user or you lack CAP_SYS_PTRACE; fix: run as "
        "its user or root (containers: --cap-add SYS_PTRACE)"
    )

"""Capture the Python and native stacks of many processes at once, safely and within a time bound.

For each process, in its own thread, cheapest and safest first:

1. read /proc/PID/task/*/stat: a thread in D state or a stopped process must never be paused (the
   pause waits for ever and freezes every other thread meanwhile, or fails outright);
2. py-spy: `--native` when asked and the process may be paused, falling back to plain; `--nonblocking`
   when it may not;
3. the faulthandler hook, for an advertised process, when py-spy is missing or refused (no ptrace);
4. gdb, for a process that is not Python (or that py-spy could not read), when it may be paused.

Every tool runs with a deadline taken from one shared budget and is killed and reaped when it overruns.
Nothing raises: what went wrong is told in ProcessStack.error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.observations import ProcessStack, ThreadStack
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import faultdump, gdb, pyspy, rlocks
from jobwarden.probes.pyhooks import HookAdvert, read_advert
from jobwarden.probes.stackbase import (
    CaptureError,
    Deadline,
    Failure,
    TaskView,
    describe_d_state,
    ptrace_denied_help,
    read_tasks,
)

MAX_PARALLEL = 64  # threads, each mostly waiting on one tool; beyond this the machine, not we, is the limit
_FIRST_TRY_SHARE = 0.5  # a step that may still fall back leaves at least half the time to the fallback


@dataclass(frozen=True)
class Tools:
    """Where the outside tools are (None: not installed), found once per capture."""

    py_spy: Path | None
    gdb: Path | None
    py_spy_missing: str = ""

    @classmethod
    def find(cls) -> Tools:
        return cls(pyspy.find_py_spy(), gdb.find_gdb(), pyspy.missing_message())


def capture_stacks(
    pids: Sequence[int],
    *,
    procfs: ProcFS,
    py_dir: Path | None = None,
    native: bool = True,
    timeout_s: float = 5.0,
    tools: Tools | None = None,
    owners: bool = False,
) -> list[ProcessStack]:
    """One ProcessStack per pid, in the order given, within about `timeout_s` in total. `owners`: py-spy
    reads each frame's `self` address too (Frame.owner), in the same pause, and the RLocks the frames'
    locals name get their owner from the process's memory (Frame.rlocks, probes.rlocks).

    Returns with every thread and tool it started ended: safe for a single-threaded caller that forks
    afterwards (the shim)."""
    if not pids:
        return []
    deadline = Deadline(timeout_s)
    found = tools or Tools.find()
    # gdb spends a CPU-second reading symbols: run as many at once as there are CPUs, so that some finish
    # in time, rather than all at once and none
    gdb_slots = threading.BoundedSemaphore(os.cpu_count() or 1)

    def one(pid: int) -> ProcessStack:
        return _Capture(pid, procfs, py_dir, native, deadline, found, gdb_slots, owners).run()

    with ThreadPoolExecutor(max_workers=min(len(pids), MAX_PARALLEL), thread_name_prefix="stacks") as pool:
        return list(pool.map(one, pids))


@dataclass
class _Capture:
    """The capture of one process: tries methods in order, keeps notes of what failed and why."""

    pid: int
    procfs: ProcFS
    py_dir: Path | None
    native: bool
    deadline: Deadline
    tools: Tools
    gdb_slots: threading.BoundedSemaphore
    owners: bool = False
    notes: list[str] = field(default_factory=list)
    cmdline: str = ""
    denied: bool = False

    def run(self) -> ProcessStack:
        try:
            self.cmdline = self.procfs.cmdline(self.pid)
            tasks = read_tasks(self.procfs, self.pid)
        except ProcessGone:
            return self._none("exited before its stack could be taken")
        except AccessDenied as err:
            return self._none(f"cannot read its threads in /proc: {err.message}")
        try:
            return self._capture(tasks)
        except CaptureError as err:
            self.notes.append(err.message)
            return self._none()
        except Exception as err:  # a diagnosis tool must never take the caller down with it
            self.notes.append(f"internal error while capturing: {type(err).__name__}: {err}")
            return self._none()

    def _capture(self, tasks: TaskView) -> ProcessStack:
        if not tasks.may_block:
            self.notes.append(self._why_not_paused(tasks))
        advert = read_advert(self.py_dir, self.pid)
        python = advert is not None or looks_like_python(self.procfs, self.pid)
        if self.tools.py_spy is not None:
            got = self._py_spy(tasks, self.tools.py_spy, fallbacks=advert is not None)
            if got is not None:
                return got
        elif python:
            self.notes.append(self.tools.py_spy_missing)
        if advert is not None:
            got = self._faulthandler(tasks, advert)
            if got is not None:
                return got
        return self._gdb(tasks, python)

    # --- py-spy ---------------------------------------------------------------------------------------

    def _py_spy(self, tasks: TaskView, binary: Path, fallbacks: bool) -> ProcessStack | None:
        """py-spy's stacks, or None to go on with the next method (after noting why)."""
        modes = [pyspy.Mode.NONBLOCKING]
        if tasks.may_block:
            modes = [pyspy.Mode.NATIVE, pyspy.Mode.BLOCKING] if self.native else [pyspy.Mode.BLOCKING]
        while modes:
            mode = modes.pop(0)
            last = mode == pyspy.Mode.NONBLOCKING and not fallbacks and self.tools.gdb is None
            budget = self._budget(last)  # none left: this process ends here, uncaptured
            try:
                data = pyspy.dump(binary, self.pid, mode, budget, self.owners)
            except CaptureError as err:
                if err.kind == Failure.GONE:
                    raise
                if err.kind == Failure.NOT_PYTHON:
                    return None
                if err.kind == Failure.DENIED:
                    self.denied = True
                    self.notes.append(ptrace_denied_help(self.procfs, self.pid))
                    return None
                self.notes.append(f"{mode.value}: {err.message}")
                if err.kind == Failure.UNAVAILABLE:
                    return None
                modes = self._after_failure(mode)
                continue
            threads = pyspy.parse_dump(data, tasks.states)
            if self.owners:  # the RLocks the locals name: their owners, from memory, right after the dump
                threads = rlocks.with_owners(self.pid, threads, str(self.procfs.root))
            return self._done(mode.value, _with_kernel_threads(threads, tasks))
        return None

    def _after_failure(self, mode: pyspy.Mode) -> list[pyspy.Mode]:
        """What to try after a py-spy mode failed. A pause that hung or failed may mean a thread entered
        D state, or the process was stopped, since we looked: look again, and read without pausing if it
        must not be paused now. Plain py-spy follows a failed --native; a read without pausing follows a
        failed plain one (it needs less of the target)."""
        if mode == pyspy.Mode.NONBLOCKING:
            return []
        try:
            tasks = read_tasks(self.procfs, self.pid)
        except (ProcessGone, AccessDenied) as err:
            raise CaptureError(Failure.GONE, "exited during the capture") from err
        if not tasks.may_block:
            self.notes.append(self._why_not_paused(tasks))
            return [pyspy.Mode.NONBLOCKING]
        return [pyspy.Mode.BLOCKING] if mode == pyspy.Mode.NATIVE else [pyspy.Mode.NONBLOCKING]

    # --- faulthandler ---------------------------------------------------------------------------------

    def _faulthandler(self, tasks: TaskView, advert: HookAdvert) -> ProcessStack | None:
        if tasks.stopped:
            # The handler cannot run until someone continues the process, and the signal would stay
            # pending and make it dump later: leave it alone.
            self.notes.append("faulthandler not asked: a stopped process cannot run its handler")
            return None
        # Read again right before the signal: the job may have set the signal for itself since (the hooks
        # then withdraw it from the advert), and py-spy's tries may have taken seconds.
        fresh = read_advert(self.py_dir, self.pid)
        if fresh is None or fresh.process != advert.process:
            self.notes.append("faulthandler not asked: its hooks' advert is gone")
            return None
        advert = fresh
        deadline = Deadline(self._budget(last=not self.tools.gdb))
        try:
            threads = faultdump.request_dump(advert, self.procfs, deadline)
        except CaptureError as err:
            if err.kind == Failure.GONE:
                raise
            self.notes.append(f"faulthandler: {err.message}")
            return None
        self.notes.append("Python frames only (faulthandler: no native frames, no thread ids)")
        return self._done("faulthandler", threads)

    # --- gdb --------------------------------------------------------------------------------------------

    def _gdb(self, tasks: TaskView, python: bool) -> ProcessStack:
        if self.tools.gdb is None:
            what = "py-spy could not read it" if python else "not a Python process"
            raise CaptureError(Failure.UNAVAILABLE, f"{what}, and gdb is not installed (apt install gdb)")
        if not tasks.may_block:
            raise CaptureError(Failure.FAILED, "gdb not used: attaching would pause the process")
        if self.denied:
            raise CaptureError(Failure.DENIED, "gdb not tried: ptrace is denied")
        if not self.gdb_slots.acquire(timeout=self.deadline.remaining()):
            raise CaptureError(Failure.TIMEOUT, "the time allowed ran out while other gdb runs went first")
        try:
            text = gdb.dump(self.tools.gdb, self.pid, self._budget(last=True))
        except CaptureError as err:
            if err.kind == Failure.TIMEOUT:
                self._clear_pending_stop(tasks)
            if err.kind == Failure.DENIED:
                raise CaptureError(Failure.DENIED, ptrace_denied_help(self.procfs, self.pid)) from err
            raise
        finally:
            self.gdb_slots.release()
        if python:
            self.notes.append("native frames only (gdb)")
        return self._done(gdb.METHOD, gdb.parse_backtrace(text, tasks.states))

    def _clear_pending_stop(self, tasks: TaskView) -> None:
        """gdb's PTRACE_ATTACH queued a SIGSTOP that its death may leave pending; SIGCONT discards it.
        Never for a process that was stopped before we came: SIGCONT would resume it."""
        if tasks.process_state in ("T", "t"):
            return
        with contextlib.suppress(ProcessGone, AccessDenied):
            fd = pidfds.open_pidfd(self.pid)
            try:
                if self.procfs.identity_matches(self.pid, tasks.start_time):
                    pidfds.send_signal(fd, self.pid, signal.SIGCONT)
                    self.notes.append("sent SIGCONT after the timed-out attach, so no stop stays pending")
            finally:
                pidfds.close(fd)

    # --- helpers ----------------------------------------------------------------------------------------

    def _budget(self, last: bool) -> float:
        if self.deadline.expired:
            raise CaptureError(Failure.TIMEOUT, "the time allowed for the dump ran out")
        return self.deadline.remaining() if last else self.deadline.share(_FIRST_TRY_SHARE)

    def _why_not_paused(self, tasks: TaskView) -> str:
        if tasks.in_d_state:
            return describe_d_state(self.procfs, tasks) + ": read without pausing it"
        return f"stopped ({tasks.process_state}): read without pausing it, and left stopped"

    def _done(self, method: str, threads: tuple[ThreadStack, ...]) -> ProcessStack:
        return ProcessStack(self.pid, method, threads, "; ".join(self.notes) or None, self.cmdline)

    def _none(self, error: str | None = None) -> ProcessStack:
        if error:
            self.notes.append(error)
        return ProcessStack(self.pid, "none", (), "; ".join(self.notes) or "no stack", self.cmdline)


def _with_kernel_threads(threads: tuple[ThreadStack, ...], tasks: TaskView) -> tuple[ThreadStack, ...]:
    """Add the threads py-spy does not list (native threads: CUDA, NCCL, OpenMP pools...), with their
    kernel state, so a thread stuck in D state outside Python is still seen."""
    listed = {t.tid for t in threads}
    extra = tuple(
        ThreadStack(tid, tasks.names.get(tid), (), state)
        for tid, state in sorted(tasks.states.items())
        if tid not in listed
    )
    return threads + extra


def looks_like_python(procfs: ProcFS, pid: int) -> bool:
    """/proc's opinion: the executable is a python, or a libpython is mapped (embedded interpreters)."""
    with contextlib.suppress(OSError):
        if os.path.basename(os.readlink(procfs.root / str(pid) / "exe")).startswith("python"):
            return True
    with contextlib.suppress(OSError), open(procfs.root / str(pid) / "maps") as fh:
        return any("libpython" in line for line in fh)
    return False

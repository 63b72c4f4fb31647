"""What the supervisor asks of the operating system, behind one protocol: `SystemJobOS` in the shim,
tests/fakeos.FakeJobOS in the unit tests of the loop's decisions (no process started, a fake clock; a
test's tool, not shipped).

It covers starting the job (the cgroup, the spawn), holding its tree (discovery and pidfds, the exits),
signalling and waiting, the cgroup's kill, and the watches that read the machine for the diagnosis
(memory and OOM evidence; stacks and progress). Shaped like control/killer.Handles.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.cgroup import JobCgroup, cgroup_path, create_job_cgroup, find_job_cgroup
from jobwarden.osapi.process import BLOCKED_UNTIL_HANDLED, spawn_job
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.waiting import wait_readable
from jobwarden.shim.record.recorder import log
from jobwarden.shim.tree.exits import ExitCollector
from jobwarden.shim.tree.jobtree import JobTree, Member
from jobwarden.shim.tree.sightings import Sightings

if TYPE_CHECKING:  # loaded once the CLI has its answer: `run` waits for nothing it does not need
    from jobwarden.probes.oom import OomCounters
    from jobwarden.shim.admission.resources import MemoryGuard
    from jobwarden.shim.record.fingerprint import FingerprintTask
    from jobwarden.shim.watch.diagnosis import Diagnoser
    from jobwarden.store import JobRecord, Store

HANDLED_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class JobOS(Protocol):
    # HANDLED_SIGNALS (and an attached shim's `extra`, shim.run.enginestop) arrive as bytes on wake_fd
    def install_signals(self, wake_fd: int, extra: tuple[int, ...] = ()) -> None: ...

    def uninstall_signals(self, wake_fd: int) -> None: ...  # before wake_fd is closed

    def create_cgroup(self, name: str) -> JobCgroup | None: ...

    def find_cgroup(self, containment: str | None) -> JobCgroup | None: ...  # an adopted run's

    def kill_cgroup(self, cgroup: JobCgroup) -> None: ...  # raises OSError

    def spawn(
        self, argv: list[str], cwd: str, env: dict[str, str], output: str, join_cgroup: str | None
    ) -> int: ...  # raises SpawnError

    def tree(self, procfs: ProcFS, shim_pid: int, markers: dict[str, str]) -> JobTree: ...

    def exits(self, tree: JobTree) -> ExitCollector: ...

    def listen(self, fifo: int | None, kernel_events: bool) -> Sightings: ...

    def send_signal(self, member: Member, sig: int) -> None: ...  # raises AccessDenied

    def wait(self, fds: list[int], timeout_s: float) -> set[int]: ...  # those readable

    def exit_status(self, child_pid: int) -> int | None: ...  # an ended child's, left unreaped; None: running

    def memory_guard(
        self, cgroup: JobCgroup | None, limit_bytes: int | None, procfs: ProcFS
    ) -> MemoryGuard: ...

    def oom_counters(self, cgroup: JobCgroup | None) -> OomCounters | None: ...  # before the job starts

    def diagnoser(
        self,
        store: Store,
        job: JobRecord,
        run: int,
        procfs: ProcFS,
        tree: JobTree,
        window_s: float | None,
        now_mono: float,
        claimed_gpus: bool,
    ) -> Diagnoser: ...

    def fingerprint(
        self, job: JobRecord, env: dict[str, str], monotonic: Callable[[], float]
    ) -> FingerprintTask | None: ...  # its helpers started; None: no fingerprint is taken


class SystemJobOS:
    def install_signals(self, wake_fd: int, extra: tuple[int, ...] = ()) -> None:
        signal.set_wakeup_fd(wake_fd)
        for sig in HANDLED_SIGNALS + extra:
            signal.signal(sig, lambda *_: None)  # the wakeup fd carries the signal number to the loop
        if signal.SIGHUP not in extra:  # an attached shim relays it to the job
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED_UNTIL_HANDLED)  # blocked by an attached fork

    def uninstall_signals(self, wake_fd: int) -> None:
        with contextlib.suppress(ValueError):  # not the main thread: it never installed the fd
            previous = signal.set_wakeup_fd(-1)
            if previous not in (-1, wake_fd):
                signal.set_wakeup_fd(previous)  # someone else's: put it back

    def create_cgroup(self, name: str) -> JobCgroup | None:
        return create_job_cgroup(name)

    def find_cgroup(self, containment: str | None) -> JobCgroup | None:
        return find_job_cgroup(cgroup_path(containment))

    def kill_cgroup(self, cgroup: JobCgroup) -> None:
        cgroup.kill_all()

    def spawn(
        self, argv: list[str], cwd: str, env: dict[str, str], output: str, join_cgroup: str | None
    ) -> int:
        return spawn_job(argv, cwd, env, output, join_cgroup)

    def tree(self, procfs: ProcFS, shim_pid: int, markers: dict[str, str]) -> JobTree:
        return JobTree(procfs, shim_pid, markers)

    def exits(self, tree: JobTree) -> ExitCollector:
        return ExitCollector(tree)

    def listen(self, fifo: int | None, kernel_events: bool) -> Sightings:
        return Sightings.open(fifo, kernel_events)

    def send_signal(self, member: Member, sig: int) -> None:
        pidfds.send_signal(member.pidfd, member.pid, sig)

    def wait(self, fds: list[int], timeout_s: float) -> set[int]:
        return wait_readable(fds, timeout_s)

    def exit_status(self, child_pid: int) -> int | None:
        try:
            info = os.waitid(os.P_PID, child_pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return None
        if info is None:
            return None
        if info.si_code == os.CLD_EXITED:
            return info.si_status << 8
        return info.si_status  # killed (or dumped core) by this signal

    def memory_guard(self, cgroup: JobCgroup | None, limit_bytes: int | None, procfs: ProcFS) -> MemoryGuard:
        from jobwarden.shim.admission.resources import MemoryGuard

        return MemoryGuard(cgroup, limit_bytes, procfs, log)

    def oom_counters(self, cgroup: JobCgroup | None) -> OomCounters | None:
        from jobwarden.probes.oom import counters_before_start

        return counters_before_start(cgroup)

    def diagnoser(
        self,
        store: Store,
        job: JobRecord,
        run: int,
        procfs: ProcFS,
        tree: JobTree,
        window_s: float | None,
        now_mono: float,
        claimed_gpus: bool,
    ) -> Diagnoser:
        from jobwarden.shim.watch.diagnosis import Diagnoser
        from jobwarden.shim.watch.gpuwatch import open_gpu_watch

        diag = Diagnoser(store, job, run, procfs, tree, window_s, now_mono)
        diag.gpu = open_gpu_watch(claimed=claimed_gpus)
        return diag

    def fingerprint(
        self, job: JobRecord, env: dict[str, str], monotonic: Callable[[], float]
    ) -> FingerprintTask | None:
        from jobwarden.shim.record.fingerprint import FingerprintTask

        return FingerprintTask(job, env, monotonic)

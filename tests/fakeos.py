"""A stand-in for the operating system under the supervisor (jobwarden.shim.run.jobos.JobOS): the loop's
decisions tested without starting a process, on a fake clock. A test's tool: it lives with the tests, out of
the shipped package.

Processes are records: spawned or forked, they live until they exit or a signal they do not ignore ends
them (SIGKILL always does). Time moves only while the supervisor waits: `wait` advances the clock to the
end of its timeout, or to the next action a test scheduled with `at`, whichever comes first, so a test
reads as a timeline ("at 5 s the user asks for a stop"). Every signal sent is in `sent`, with its moment.
Signals to the shim itself (`signal_shim`) go through the real wakeup pipe, as the kernel's would.

The diagnosis and memory watches are fakes too: the verdicts a test wants (`verdict_at`) come out of
`on_tick`, and the deaths the loop reported are kept in `deaths_judged`.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from jobwarden.clock import FakeClock
from jobwarden.errors import AccessDenied
from jobwarden.model import ProcessEnd, ProcessId, ProcessSnapshot
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.osapi.process import SpawnError
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.oom import OomCounters
from jobwarden.shim.admission.resources import MemoryGuard
from jobwarden.shim.record.fingerprint import FingerprintTask
from jobwarden.shim.tree.exits import ExitCollector
from jobwarden.shim.tree.jobtree import JobTree, Member
from jobwarden.shim.tree.sightings import Sightings
from jobwarden.shim.watch.diagnosis import Diagnoser, Verdict
from jobwarden.shim.watch.watchdog import ProgressTracker
from jobwarden.store import JobRecord, Store

_NEVER_S = 30 * 86400.0  # a loop that never ends fails its test instead
_FAKE_FD_BASE = 1 << 20  # fake pidfds: above any real descriptor, told apart from the real wakeup pipe
_PID_MAX_LIMIT = 1 << 22  # the kernel's PID_MAX_LIMIT: every real pid is below it


@dataclass
class FakeProcess:
    pid: int
    ppid: int
    cmdline: str
    ignores: frozenset[int] = frozenset()  # signals it survives; SIGKILL is never among them
    status: int | None = None  # its wait status once it has ended
    denied: bool = False  # signals to it fail as they do for another user's process

    @property
    def alive(self) -> bool:
        return self.status is None


@dataclass
class FakeJobOS:
    clock: FakeClock
    processes: dict[int, FakeProcess] = field(default_factory=dict)
    sent: list[tuple[float, int, str]] = field(default_factory=list)  # (seconds since start, pid, signal)
    spawned: list[list[str]] = field(default_factory=list)
    spawned_at: list[float] = field(default_factory=list)  # seconds since start, one per spawn
    cgroup_kills: int = 0
    verdicts: list[tuple[float, Verdict]] = field(default_factory=list)
    deaths_judged: list[ProcessEnd] = field(default_factory=list)
    main_ignores: frozenset[int] = frozenset()  # signals the next spawned job ignores
    spawn_error: SpawnError | None = None  # what spawn raises: the command cannot be started
    _lives: list[tuple[float, int]] = field(default_factory=list)  # (seconds, exit code) per spawn, in order
    _actions: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    _wake_fd: int | None = None
    _next_pid: int = _PID_MAX_LIMIT  # past any real pid: a fake pid never names a process of this machine

    def __post_init__(self) -> None:
        self.start = self.clock.monotonic()

    # --- what a test does -------------------------------------------------------------------------

    def at(self, seconds: float, action: Callable[[], None]) -> None:
        """Run `action` once the clock is `seconds` past the start."""
        self._actions.append((self.start + seconds, action))
        self._actions.sort(key=lambda a: a[0])

    def verdict_at(self, seconds: float, verdict: Verdict) -> None:
        self.verdicts.append((self.start + seconds, verdict))

    def attempts_exit(self, *lives: tuple[float, int]) -> None:
        """Each job spawned from now on, in order, exits `seconds` after its spawn with `code`: the
        attempts of a restarting job, however long each backoff turns out."""
        self._lives.extend(lives)

    def fork(self, ppid: int, cmdline: str, ignores: Iterable[int] = ()) -> int:
        self._next_pid += 1
        self.processes[self._next_pid] = FakeProcess(self._next_pid, ppid, cmdline, frozenset(ignores))
        return self._next_pid

    def exit(self, pid: int, code: int = 0) -> None:
        self.processes[pid].status = code << 8

    def _exit_if_alive(self, pid: int, code: int) -> None:
        if self.processes[pid].alive:  # killed before its time: the signal's status stays
            self.exit(pid, code)

    def signal_shim(self, sig: int) -> None:
        assert self._wake_fd is not None, "the supervisor has not installed its signals"
        os.write(self._wake_fd, bytes([sig]))

    def elapsed(self) -> float:
        return self.clock.monotonic() - self.start

    def signals_to(self, pid: int) -> list[tuple[float, str]]:
        return [(at, name) for at, p, name in self.sent if p == pid]

    # --- the JobOS protocol -----------------------------------------------------------------------

    def install_signals(self, wake_fd: int, extra: tuple[int, ...] = ()) -> None:
        self._wake_fd = wake_fd

    def uninstall_signals(self, wake_fd: int) -> None:
        if self._wake_fd == wake_fd:  # as signal.set_wakeup_fd: another supervisor's stays
            self._wake_fd = None

    def create_cgroup(self, name: str) -> JobCgroup | None:
        return None

    def find_cgroup(self, containment: str | None) -> JobCgroup | None:
        return None

    def kill_cgroup(self, cgroup: JobCgroup) -> None:
        self.cgroup_kills += 1

    def spawn(
        self, argv: list[str], cwd: str, env: dict[str, str], output: str, join_cgroup: str | None
    ) -> int:
        if self.spawn_error is not None:
            raise self.spawn_error
        self.spawned.append(argv)
        self.spawned_at.append(self.elapsed())
        pid = self.fork(os.getpid(), " ".join(argv), self.main_ignores)
        if self._lives:
            seconds, code = self._lives.pop(0)
            self.at(self.elapsed() + seconds, lambda: self._exit_if_alive(pid, code))
        return pid

    def tree(self, procfs: ProcFS, shim_pid: int, markers: dict[str, str]) -> JobTree:
        return FakeTree(self, procfs, shim_pid, markers)

    def exits(self, tree: JobTree) -> ExitCollector:
        return FakeExits(self, tree)

    def listen(self, fifo: int | None, kernel_events: bool) -> Sightings:
        return Sightings(None, fifo)

    def send_signal(self, member: Member, sig: int) -> None:
        proc = self.processes[member.pid]
        name = signal.Signals(sig).name
        if proc.denied:
            raise AccessDenied(member.pid, f"send {name} to", "it runs as another user")
        if not proc.alive:
            return
        self.sent.append((self.elapsed(), member.pid, name))
        if sig == signal.SIGKILL or sig not in proc.ignores:
            proc.status = sig

    def exit_status(self, child_pid: int) -> int | None:
        process = self.processes.get(child_pid)
        return process.status if process else None

    def wait(self, fds: list[int], timeout_s: float) -> set[int]:
        if self.elapsed() > _NEVER_S:
            raise RuntimeError(f"the supervisor still waits after {_NEVER_S:.0f} fake seconds")
        ready = self._ready(fds)
        if ready:
            return ready
        until = self.clock.monotonic() + max(0.0, timeout_s)
        if self._actions and self._actions[0][0] <= until:
            until = self._actions[0][0]
        self.clock.advance(max(0.0, until - self.clock.monotonic()))
        while self._actions and self._actions[0][0] <= self.clock.monotonic():
            self._actions.pop(0)[1]()
        return self._ready(fds)

    def memory_guard(self, cgroup: JobCgroup | None, limit_bytes: int | None, procfs: ProcFS) -> MemoryGuard:
        return FakeMemoryGuard(cgroup, None, procfs, lambda _: None)

    def oom_counters(self, cgroup: JobCgroup | None) -> OomCounters | None:
        return None

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
        return FakeDiagnoser(self, window_s, now_mono)

    def fingerprint(
        self, job: JobRecord, env: dict[str, str], monotonic: Callable[[], float]
    ) -> FingerprintTask | None:
        return None  # the loop's decisions are tested here; the fingerprint, on real runs

    def _ready(self, fds: list[int]) -> set[int]:
        real = [fd for fd in fds if fd < _FAKE_FD_BASE]
        poller = select.poll()
        for fd in real:
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(0)}
        ended = {_FAKE_FD_BASE + p.pid for p in self.processes.values() if not p.alive}
        return ready | {fd for fd in fds if fd in ended}


class FakeTree(JobTree):
    """The job's tree over FakeJobOS: every live fake process is the job's, found at the next discovery."""

    def __init__(self, fake: FakeJobOS, procfs: ProcFS, shim_pid: int, markers: dict[str, str]) -> None:
        super().__init__(procfs, shim_pid, markers)
        self.fake = fake

    def _member(self, pid: int) -> Member:
        proc = self.fake.processes[pid]
        member = Member(ProcessId(pid, 1000 + pid), _FAKE_FD_BASE + pid, proc.ppid, proc.cmdline)
        self.members[pid] = member
        return member

    def seed_child(self, pid: int) -> Member:
        return self._member(pid)

    def seed(self, pid: int, session_leader: bool = False) -> Member | None:
        return self._member(pid) if self.fake.processes[pid].alive else None

    def discover(self, full: bool = False) -> list[Member]:
        held = set(self.members) | {ident.pid for ident in self._ended}
        return [
            self._member(p.pid) for p in list(self.fake.processes.values()) if p.alive and p.pid not in held
        ]

    def exited(self) -> list[Member]:
        return [m for m in self.members.values() if not self.fake.processes[m.pid].alive]

    def drop(self, member: Member) -> None:
        self.members.pop(member.pid, None)
        self._ended.add(member.ident)

    def zombie_status(self, member: Member) -> int | None:
        return self.fake.processes[member.pid].status

    def sample(self, now: float) -> list[ProcessSnapshot]:
        return [
            ProcessSnapshot(m.pid, m.ppid, m.ident.start_time, "S", m.cmdline, 1 << 20, 0.0)
            for m in self.members.values()
        ]

    def close(self) -> None:
        self.members.clear()


class FakeExits(ExitCollector):
    def __init__(self, fake: FakeJobOS, tree: JobTree) -> None:
        super().__init__(tree)
        self.fake = fake

    def collect(self, now: float, main: Member | None = None) -> list[ProcessEnd]:
        ends = []
        for member in self.tree.exited():
            status = self.fake.processes[member.pid].status
            ends.append(
                ProcessEnd(member.pid, member.ident.start_time, status, now, member.ppid, member.cmdline)
            )
            self.tree.drop(member)
        return ends


class FakeMemoryGuard(MemoryGuard):
    def start(self, fresh_cgroup: bool = False, before: OomCounters | None = None) -> None:
        pass


class _ScheduledTracker(ProgressTracker):
    """A verdict the test scheduled is due at its moment, as a real hang is at its window's end: the
    loop's tick comes then, however slow its idle pace."""

    def __init__(self, fake: FakeJobOS, window_s: float | None, now_mono: float) -> None:
        super().__init__(window_s, now_mono)
        self.fake = fake

    def due_at(self) -> float | None:
        return min((at for at, _ in self.fake.verdicts), default=None)


class FakeDiagnoser(Diagnoser):
    """Says what the test scheduled, when it is due; judges nothing itself."""

    def __init__(self, fake: FakeJobOS, window_s: float | None, now_mono: float) -> None:
        self.fake = fake
        self.tracker = _ScheduledTracker(fake, window_s, now_mono)
        self.gpu = None
        self.oom = None
        self.main_pid = None

    def on_exits(
        self, ended: Sequence[ProcessEnd], now: float, now_mono: float, main: Member | None
    ) -> Verdict | None:
        self.fake.deaths_judged.extend(ended)
        return None

    def on_tick(self, snaps: Sequence[ProcessSnapshot], now: float, now_mono: float) -> Verdict | None:
        due = [v for v in self.fake.verdicts if v[0] <= now_mono]
        if not due:
            return None
        self.fake.verdicts.remove(due[0])
        return due[0][1]

    def on_end(self, now: float, now_mono: float) -> Verdict | None:
        return None

"""The Python stack of the job's loop process, sampled rarely for the speed rules, two ways:

- now and then, for the data-loading rules (rules.speed.loading): one `py-spy dump --nonblocking` every
  STACK_EVERY_S, and only while it can matter: py-spy is installed, the job is busy, and a process of the
  job has torch loaded (libtorch in /proc/PID/maps: a DataLoader is possible). Sooner while the job starts
  to look slow: when the speed watch's counters begin to say that a rule read from the stacks may hold
  (rules.speed.loading.worth_sampling: busy DataLoader workers, one busy loop beside idle CPUs, a step
  rate that fell), a burst of BURST_DUMPS dumps BURST_EVERY_S apart, enough for the rules to decide within
  seconds instead of a minute; then back to STACK_EVERY_S. At most one burst every BURST_GAP_S: a job that
  never starts to look slow pays nothing more, one that keeps flapping at most BURST_DUMPS dumps more in
  that time;
- once per stall of the step counter, for periodic-stall (rules.speed.stalls): when the speed watch says
  the counter has stood still as long as a stall (STALL_TIMES x its usual gap, at least STALL_MIN_S), one
  dump tagged with the stall, busy or not and torch or not (a checkpoint can stall any Python job).

Which process: the job's loop, the process that has torch loaded and is no worker (comm pt_data_worker, or
a multiprocessing/forked Python child of a job process: rules.speed.threads.worker_kind), the one nearest
the root of the tree. A job started through a wrapper (`sh -c "python train.py"`, a bash script, `uv
run`) has a root with no torch, and sampling the root would see nothing. The pick holds until that process
exits. Without torch anywhere, the stall dumps take the Python process nearest the root. Known limit: a
launcher that loads torch itself (torchrun's agent, an mp.spawn parent) is picked over its ranks.

Cheap for the job by construction: --nonblocking reads the target's memory without pausing it (the job
loses only the CPU py-spy takes, about 10-30 ms per dump of a torch process, research/slowness.md 5.6: at
one dump per 10 s, under 0.3 % of a core; a burst, 12 dumps, 0.1-0.4 s of CPU at most every 10
minutes, docs/measurements.md "The stack sampler's bursts (issue 28)"; a stall adds one dump per stall, a
stall being at least 3 s); the dump runs on a daemon thread so the shim's loop never waits on it. The last
STACKS_KEPT samples (and STALLS_KEPT stall samples) are kept; a share of them is a share of the loop's
time.

JOBWARDEN_SPEED_STACK_EVERY_S changes the steady interval."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import ProcessId, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pyspy import Mode, dump, find_py_spy, parse_dump
from jobwarden.probes.stackbase import CaptureError
from jobwarden.rules.speed.evidence import StackSample
from jobwarden.rules.speed.loading import LOADER_WORKER_COMM
from jobwarden.rules.speed.threads import worker_kind
from jobwarden.shim.record.recorder import log

if TYPE_CHECKING:
    from jobwarden.shim.tree.jobtree import Member

STACK_EVERY_ENV = "JOBWARDEN_SPEED_STACK_EVERY_S"
STACK_EVERY_S = 10.0
STACKS_KEPT = 12  # two minutes at the default interval
BURST_EVERY_S = 2.0  # while the job starts to look slow, a dump this often ...
BURST_DUMPS = STACKS_KEPT  # ... this many times: the samples kept are then all of the new state ...
BURST_GAP_S = 600.0  # ... and a burst at most this often
# A burst ends after this long whatever it took: while the job is not busy or has no torch loaded yet (it
# is importing it), each look is a read of maps, not a dump; those stop being looked for every 2 s too
BURST_S = 2 * BURST_DUMPS * BURST_EVERY_S
STALLS_KEPT = 12  # one a stall: the last dozen stalls
STACK_MAX_AGE_S = 180.0  # a sample older than this says nothing about now
STACK_TIMEOUT_S = 2.0
BUSY_PERCENT = 50.0  # the job's processes together: below, it is not slow, it is idle
TORCH_LIBS = (b"libtorch_cpu", b"libtorch_python")
PYTHON_LIBS = (b"libpython",)  # an embedded interpreter, or a python linked against its shared library
MAX_LOOKS = 16  # processes (nearest the root first) whose maps a pick reads at most: a 64-rank job reads few


def stack_every_s() -> float:
    value = os.environ.get(STACK_EVERY_ENV, "")
    with contextlib.suppress(ValueError):
        if float(value) > 0:
            return float(value)
    return STACK_EVERY_S


def loop_candidates(members: Sequence[Member]) -> list[Member]:
    """The job's processes that may run its loop, nearest the root of the tree first: no DataLoader worker,
    no multiprocessing (spawn, forkserver) or forked Python worker of another process of the job."""
    by_pid = {m.pid: m for m in members}

    def depth(m: Member) -> int:
        n, seen = 0, {m.pid}
        while m.ppid in by_pid and m.ppid not in seen:
            m = by_pid[m.ppid]
            seen.add(m.pid)
            n += 1
        return n

    found = []
    for m in members:
        parent = by_pid.get(m.ppid)
        if m.comm == LOADER_WORKER_COMM or (parent is not None and worker_kind(m.cmdline, parent.cmdline)):
            continue
        found.append(m)
    found.sort(key=lambda m: (depth(m), m.pid))
    return found


class StackSampler:
    def __init__(self, procfs: ProcFS, every_s: float | None = None) -> None:
        self.procfs = procfs
        self.every_s = every_s if every_s is not None else stack_every_s()
        self.samples: deque[StackSample] = deque(maxlen=STACKS_KEPT)
        self.stall_samples: deque[StackSample] = deque(maxlen=STALLS_KEPT)
        self._binary: Path | bool | None = False  # False: not looked for yet
        self.loop: ProcessId | None = None  # the process with torch loaded, nearest the root
        self.python: ProcessId | None = None  # without one: the Python process nearest the root
        self._next = 0.0
        self._pending: StackDump | None = None
        self._stall_seen: float | None = None  # the stall (its last move's moment) dumped or given up on
        self._stall_failed = False  # the last stall dump got nothing (ptrace refused, not Python after all)
        self._suspected = False  # the speed watch's last word: a rule read from the stacks may hold
        self._burst_at: float | None = None  # when the last burst began
        self.burst_left = 0  # dumps of the burst under way still to take, BURST_EVERY_S apart

    @property
    def pid(self) -> int | None:
        """The process sampled (None: none picked yet)."""
        ident = self.loop or self.python
        return ident.pid if ident else None

    def tick(
        self,
        mono: float,
        members: Sequence[Member],
        snaps: Sequence[ProcessSnapshot],
        stall: float | None = None,
    ) -> None:
        """`stall`: the moment of the step counter's last move when it has stood still as long as a stall
        since (the speed watch judges it), else None."""
        self._collect()
        self._forget_gone(members)
        while self.samples and self.samples[0].at < mono - STACK_MAX_AGE_S:
            self.samples.popleft()
        if self._pending is not None:
            return  # one dump at a time; a stall's waits for the next tick
        if stall is not None and stall != self._stall_seen:
            self._stall_seen = stall  # one dump a stall, whatever comes of it
            self._dump_stall(mono, members, stall)
            return
        if mono < self._next:
            return
        if self._burst_at is not None and mono >= self._burst_at + BURST_S:
            self.burst_left = 0
        self._next = mono + (min(BURST_EVERY_S, self.every_s) if self.burst_left else self.every_s)
        if sum(s.cpu_percent or 0.0 for s in snaps) < BUSY_PERCENT or not self._pick_loop(members):
            return
        binary = self._py_spy()
        if binary is not None and self.loop is not None:
            self._pending = StackDump(binary, self.loop.pid, mono)
            self.burst_left = max(self.burst_left - 1, 0)

    def suspect(self, mono: float, suspected: bool) -> None:
        """The speed watch's judgement of its counters: a rule read from the stacks may hold. When that
        becomes true, a burst begins (at most one every BURST_GAP_S), its first dump at the next tick."""
        began = suspected and not self._suspected
        self._suspected = suspected
        if began and (self._burst_at is None or mono - self._burst_at >= BURST_GAP_S):
            self._burst_at, self.burst_left = mono, BURST_DUMPS
            self._next = min(self._next, mono)

    def stall_sampling(self) -> bool:
        """Stall dumps can come: py-spy is there, a Python process to dump, and the last one worked."""
        return isinstance(self._binary, Path) and self.pid is not None and not self._stall_failed

    def span_s(self) -> float:
        return self.samples[-1].at - self.samples[0].at if len(self.samples) > 1 else 0.0

    # --- which process ------------------------------------------------------------------------------------

    def _forget_gone(self, members: Sequence[Member]) -> None:
        if self.loop is None and self.python is None:
            return
        present = {m.ident for m in members}
        if self.loop is not None and self.loop not in present:
            self.loop = None  # it exited: another is picked; its samples say nothing of the next one
            self.samples.clear()
            self.stall_samples.clear()
        if self.python is not None and self.python not in present:
            self.python = None
            if self.loop is None:
                self.stall_samples.clear()

    def _pick_loop(self, members: Sequence[Member]) -> bool:
        """The process with torch loaded nearest the root (looked for again until one has)."""
        if self.loop is None:
            for m in loop_candidates(members)[:MAX_LOOKS]:
                if self._maps(m.pid, TORCH_LIBS):
                    self.loop = m.ident
                    if self.python is not None and self.python != m.ident:
                        self.stall_samples.clear()  # another process's stalls from now on
                    break
        return self.loop is not None

    def _pick_python(self, members: Sequence[Member]) -> bool:
        if self.python is None:
            for m in loop_candidates(members)[:MAX_LOOKS]:
                if self._is_python(m.pid):
                    self.python = m.ident
                    break
        return self.python is not None

    def _maps(self, pid: int, needles: tuple[bytes, ...]) -> bool:
        with contextlib.suppress(ProcessGone, AccessDenied):
            return self.procfs.maps_any(pid, needles)
        return False

    def _is_python(self, pid: int) -> bool:
        """/proc's opinion: the executable is a python, or a libpython is mapped (embedded interpreters)."""
        with contextlib.suppress(ProcessGone):
            if (self.procfs.exe_name(pid) or "").startswith("python"):
                return True
        return self._maps(pid, PYTHON_LIBS)

    # --- dumps ------------------------------------------------------------------------------------------

    def _py_spy(self) -> Path | None:
        if self._binary is False:
            self._binary = find_py_spy()
        return self._binary if isinstance(self._binary, Path) else None  # none: the rules stay silent

    def _dump_stall(self, mono: float, members: Sequence[Member], stall: float) -> None:
        binary = self._py_spy()
        if binary is None or not (self.loop is not None or self._pick_python(members)):
            return
        pid = self.pid
        if pid is not None:
            self._pending = StackDump(binary, pid, mono, stall)

    def _collect(self) -> None:
        if self._pending is None or self._pending.is_alive():
            return
        done, self._pending = self._pending, None
        sample = done.sample
        if done.stall is not None:
            self._stall_failed = sample is None or not sample.frames
        if sample is None or not sample.frames or done.pid != self.pid:
            return  # nothing, or a process no longer the one sampled
        (self.stall_samples if done.stall is not None else self.samples).append(sample)


class StackDump(threading.Thread):
    """One dump on a daemon thread: the shim's loop never waits on py-spy, nor does its exit."""

    def __init__(self, binary: Path, pid: int, at: float, stall: float | None = None) -> None:
        super().__init__(name="speed-stack", daemon=True)
        self.binary, self.pid, self.at, self.stall = binary, pid, at, stall
        self.sample: StackSample | None = None
        self.start()

    def run(self) -> None:
        try:
            self.sample = _sample(self.binary, self.pid, self.at, self.stall)
        except Exception as err:  # a sample is optional: nothing py-spy or the OS does may take the shim down
            self.sample = None
            _say_once(type(err).__name__, f"speed stack sample failed: {type(err).__name__}: {err}")


_said: set[str] = set()  # each kind of failure goes to shim.log once: a sample comes every few seconds


def _say_once(kind: str, message: str) -> None:
    """A failing sample silences the rules that read samples (periodic-stall, the data-loading rules):
    shim.log says why, once per kind of failure (a py-spy whose output changed, a refused ptrace)."""
    if kind not in _said:
        _said.add(kind)
        log(message)


def _sample(binary: Path, pid: int, at: float, stall: float | None = None) -> StackSample | None:
    """The main thread's frames (its tid is the pid), innermost first; None when py-spy could not."""
    try:
        threads = parse_dump(dump(binary, pid, Mode.NONBLOCKING, STACK_TIMEOUT_S))
    except CaptureError as err:
        _say_once("capture", f"speed stack sample of pid {pid}: {err}")
        return None
    main = next((t for t in threads if t.tid == pid), threads[0] if threads else None)
    if main is None:
        _say_once(
            "unread", f"speed stack sample of pid {pid}: py-spy's output held no thread jobwarden reads"
        )
        return None
    frames = tuple((f.function, f.file) for f in main.frames)
    return StackSample(at, frames, tuple(f.line or 0 for f in main.frames), stall)

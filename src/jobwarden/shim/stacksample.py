"""The main process's Python stack, sampled rarely for the data-loading speed rules (rules.speed.loading):
one `py-spy dump --nonblocking` every STACK_EVERY_S, and only while it can matter: py-spy is installed, the
job is busy, and its main process has torch loaded (libtorch in /proc/PID/maps: a DataLoader is possible).

Cheap for the job by construction: --nonblocking reads the target's memory without pausing it (the job
loses only the CPU py-spy takes, about 20-30 ms per dump of a torch process, research/slowness.md 5.6: at
one dump per 10 s, under 0.3 % of a core); the dump runs on a daemon thread so the shim's loop never
waits on it. The last STACKS_KEPT samples are kept; a share of them is a share of the loop's time.

JOBWARDEN_SPEED_STACK_EVERY_S changes the interval (tests sample every 2 s to decide within a minute)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pyspy import Mode, dump, find_py_spy, parse_dump
from jobwarden.probes.stackbase import CaptureError
from jobwarden.rules.speed.evidence import StackSample

STACK_EVERY_ENV = "JOBWARDEN_SPEED_STACK_EVERY_S"
STACK_EVERY_S = 10.0
STACKS_KEPT = 12  # two minutes at the default interval
STACK_MAX_AGE_S = 180.0  # a sample older than this says nothing about now
STACK_TIMEOUT_S = 2.0
BUSY_PERCENT = 50.0  # the job's processes together: below, it is not slow, it is idle
TORCH_LIBS = (b"libtorch_cpu", b"libtorch_python")


def stack_every_s() -> float:
    value = os.environ.get(STACK_EVERY_ENV, "")
    with contextlib.suppress(ValueError):
        if float(value) > 0:
            return float(value)
    return STACK_EVERY_S


class StackSampler:
    def __init__(self, procfs: ProcFS, every_s: float | None = None) -> None:
        self.procfs = procfs
        self.every_s = every_s if every_s is not None else stack_every_s()
        self.samples: deque[StackSample] = deque(maxlen=STACKS_KEPT)
        self._binary: Path | bool | None = False  # False: not looked for yet
        self._pid: int | None = None
        self._torch = False  # the sampled pid has torch mapped (looked again until it has)
        self._next = 0.0
        self._pending: _Dump | None = None

    def tick(self, mono: float, main_pid: int | None, snaps: Sequence[ProcessSnapshot]) -> None:
        self._collect()
        if main_pid != self._pid:
            self._pid, self._torch = main_pid, False
            self.samples.clear()
        while self.samples and self.samples[0].at < mono - STACK_MAX_AGE_S:
            self.samples.popleft()
        if main_pid is None or self._pending is not None or mono < self._next:
            return
        self._next = mono + self.every_s
        if sum(s.cpu_percent or 0.0 for s in snaps) < BUSY_PERCENT or not self._has_torch(main_pid):
            return
        if self._binary is False:
            self._binary = find_py_spy()
        if not isinstance(self._binary, Path):
            return  # no py-spy: the rules that need stacks stay silent
        self._pending = _Dump(self._binary, main_pid, mono)

    def _has_torch(self, pid: int) -> bool:
        if not self._torch:
            with contextlib.suppress(ProcessGone, AccessDenied):
                self._torch = self.procfs.maps_any(pid, TORCH_LIBS)
        return self._torch

    def _collect(self) -> None:
        if self._pending is None or self._pending.is_alive():
            return
        sample, self._pending = self._pending.sample, None
        if sample is not None and sample.frames:
            self.samples.append(sample)

    def span_s(self) -> float:
        return self.samples[-1].at - self.samples[0].at if len(self.samples) > 1 else 0.0


class _Dump(threading.Thread):
    """One dump on a daemon thread: the shim's loop never waits on py-spy, nor does its exit."""

    def __init__(self, binary: Path, pid: int, at: float) -> None:
        super().__init__(name="speed-stack", daemon=True)
        self.binary, self.pid, self.at = binary, pid, at
        self.sample: StackSample | None = None
        self.start()

    def run(self) -> None:
        try:
            self.sample = _sample(self.binary, self.pid, self.at)
        except Exception:  # a sample is optional: nothing py-spy or the OS does may take the shim down
            self.sample = None


def _sample(binary: Path, pid: int, at: float) -> StackSample | None:
    """The main thread's frames (its tid is the pid), innermost first; None when py-spy could not."""
    try:
        threads = parse_dump(dump(binary, pid, Mode.NONBLOCKING, STACK_TIMEOUT_S))
    except CaptureError:
        return None
    main = next((t for t in threads if t.tid == pid), threads[0] if threads else None)
    if main is None:
        return None
    return StackSample(at, tuple((f.function, f.file) for f in main.frames))

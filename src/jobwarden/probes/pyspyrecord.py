"""`py-spy record` over a job's process tree, with the thread states sampled beside it.

Always `--nonblocking`: py-spy then reads the target's memory without pausing it. A blocking record
ptrace-stops every thread of every process at each sample; a thread that enters D state meanwhile (a
DataLoader worker reading a file, a checkpoint's fsync) makes that pause wait for ever while every other
thread stays frozen (research/hang-diagnosis.md §1.6), and the cost grows with the thread count: 2.4x
slower at 65 threads and 100 Hz, hung at 200 Hz (research/slowness.md §5.3, py-spy#872). Reading without
pausing costs the job only py-spy's own CPU; the price is a stack now and then read mid-change (py-spy
counts it as an error and goes on).

Each process of the tree gets its own record, DataLoader workers and ranks included, and so does each
process they start during the recording (research/slowness.md §5.5: the workers' `_worker_loop →
__getitem__` frames are there).

py-spy drops a thread in D state as idle; `StateSampler` reads /proc/PID/task/*/stat of the same processes
at the same rate, and counts for each thread the ticks it spent in D and where (wchan), which
probes.profiledata turns into samples of their own.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.tool import ToolUnavailable, run_tool
from jobwarden.probes.profiledata import IoWait
from jobwarden.probes.pyspy import classify_error
from jobwarden.probes.stackbase import CaptureError, Failure

MAX_OUTPUT_BYTES = 256 << 20  # py-spy's speedscope file; more is not read (a bound on our memory)
STARTUP_S = 10.0  # py-spy attaching to a torch process, and writing its file at the end
RESCAN_S = 0.5  # how often the state sampler looks for new processes (py-spy looks every 0.1 s)


MAX_RECORDS = 128  # py-spy processes at once: a larger tree is profiled in its first 128 processes


@dataclass
class Recording:
    speedscope: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (pid, py-spy's file)
    io_waits: list[IoWait] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[tuple[int, CaptureError]] = field(default_factory=list)
    state_ticks: int = 0
    left_out: int = 0  # processes beyond MAX_RECORDS


class _Records:
    """One `py-spy record` per process, each on a worker thread; a process found later (a DataLoader
    worker of the next epoch) gets one for the time that is left."""

    def __init__(self, binary: Path, rate_hz: int, duration_s: int, work_dir: Path) -> None:
        self.binary, self.rate_hz, self.work_dir = binary, rate_hz, work_dir
        self.ends = time.monotonic() + duration_s
        self.pool = ThreadPoolExecutor(max_workers=MAX_RECORDS, thread_name_prefix="py-spy")
        self.futures: dict[int, Future[tuple[dict[str, Any], list[str]] | CaptureError]] = {}
        self.left_out = 0
        self.lock = threading.Lock()

    def add(self, pid: int, seconds: int | None = None) -> None:
        """Record `pid` for `seconds`, or for the whole seconds left of the recording."""
        if seconds is None:
            seconds = math.floor(self.ends - time.monotonic())
        with self.lock:
            if pid in self.futures or seconds < 1:
                return
            if len(self.futures) >= MAX_RECORDS:
                self.left_out += 1
                return
            self.futures[pid] = self.pool.submit(
                _record_one, self.binary, pid, self.rate_hz, seconds, self.work_dir
            )


def record(
    binary: Path, pids: Sequence[int], rate_hz: int, duration_s: int, procfs: ProcFS, work_dir: Path
) -> Recording:
    """Record every process of `pids`, and those they start meanwhile, for `duration_s` at `rate_hz`;
    the thread states of the same processes are sampled meanwhile. Never raises for a process that
    could not be recorded: said in `failures`.

    One py-spy per process rather than `--subprocesses` on the main one: py-spy finds children by reading
    every process of the machine ten times a second (remoteprocess's child_processes), measured here at
    4 % of a core more than the recording itself; the state sampler finds them from the tree's own
    /proc/PID/task/TID/children, and a process the subreaper adopted is recorded too."""
    result = Recording()
    records = _Records(binary, rate_hz, duration_s, work_dir)
    for pid in pids:
        records.add(pid, duration_s)
    sampler = StateSampler(procfs, pids, 1.0 / rate_hz, on_new=records.add)
    thread = threading.Thread(target=sampler.run, name="jobwarden-states", daemon=True)
    thread.start()
    finished = False
    try:
        while True:  # the list grows while the sampler finds processes
            with records.lock:
                pending = [f for f in records.futures.values() if not f.done()]
            if not pending:
                break
            wait(pending)
        finished = True
    finally:
        sampler.stop.set()
        thread.join()
        # Ctrl-C: not held until every py-spy ends (its --duration ends it, and what it writes is lost)
        records.pool.shutdown(wait=finished, cancel_futures=not finished)
    for pid, future in sorted(records.futures.items()):
        outcome = future.result()
        if isinstance(outcome, CaptureError):
            result.failures.append((pid, outcome))
        else:
            data, notes = outcome
            result.speedscope.append((pid, data))
            result.notes.extend(notes)
    result.io_waits = sampler.io_waits()
    result.state_ticks = sampler.ticks
    result.left_out = records.left_out
    return result


def _record_one(
    binary: Path, pid: int, rate_hz: int, duration_s: int, work_dir: Path
) -> tuple[dict[str, Any], list[str]] | CaptureError:
    fd, name = tempfile.mkstemp(prefix=f"py-spy-{pid}-", suffix=".json", dir=work_dir)
    os.close(fd)
    out = Path(name)
    argv = [
        str(binary), "record", "--pid", str(pid), "--nonblocking", "--format", "speedscope",
        "--rate", str(rate_hz), "--duration", str(duration_s), "--output", str(out),
    ]  # fmt: skip
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUST_BACKTRACE": "0", "LANG": "C.UTF-8"}
    try:
        result = run_tool(argv, duration_s + STARTUP_S, env)
        if result.timed_out:
            return CaptureError(
                Failure.TIMEOUT, f"py-spy did not finish within {duration_s + STARTUP_S:.0f}s"
            )
        text = result.stderr.decode("utf-8", "replace") + result.stdout.decode("utf-8", "replace")
        if result.returncode != 0:
            return classify_error(text)
        return _read_output(out), _notes(text)
    except ToolUnavailable as err:
        return CaptureError(Failure.UNAVAILABLE, err.message)
    except CaptureError as err:
        return err
    finally:
        with contextlib.suppress(OSError):
            out.unlink()


def _read_output(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        raw = fh.read(MAX_OUTPUT_BYTES + 1)
    if len(raw) > MAX_OUTPUT_BYTES:
        raise CaptureError(Failure.FAILED, "py-spy wrote more than 256 MiB: profile for less time")
    if not raw:
        raise CaptureError(Failure.FAILED, "py-spy wrote no profile (did the process end?)")
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise CaptureError(Failure.FAILED, f"py-spy's profile is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise CaptureError(Failure.FAILED, "py-spy's profile is not a speedscope object")
    return data


def _notes(text: str) -> list[str]:
    """What py-spy said worth repeating: that it fell behind, or could not read some samples."""
    notes = []
    if "behind in sampling" in text:
        notes.append("py-spy fell behind its sampling rate: the profile has fewer samples than asked")
    for line in text.splitlines():
        if "Errors:" in line and not line.rstrip().endswith("Errors: 0"):
            count = line.rsplit("Errors:", 1)[1].strip()
            notes.append(f"{count} samples could not be read without pausing the job (left out)")
    return notes


class StateSampler:
    """Every `interval_s`, the state of every thread of the roots and their descendants; D-state ticks
    counted per thread with the kernel function waited in."""

    def __init__(
        self,
        procfs: ProcFS,
        pids: Sequence[int],
        interval_s: float,
        on_new: Callable[[int], None] = lambda pid: None,
    ) -> None:
        self.procfs, self.interval_s, self.on_new = procfs, interval_s, on_new
        self.pids: set[int] = set(pids)
        self.stop = threading.Event()
        self.ticks = 0
        self._d: dict[tuple[int, int], Counter[str]] = {}
        self._names: dict[tuple[int, int], str] = {}

    def run(self) -> None:
        next_scan = 0.0
        next_tick = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                self._find_children()
                next_scan = now + RESCAN_S
            self._tick()
            next_tick += self.interval_s
            self.stop.wait(max(0.0, next_tick - time.monotonic()))

    def _tick(self) -> None:
        self.ticks += 1
        root = self.procfs.root
        for pid in list(self.pids):
            task_dir = root / str(pid) / "task"
            try:
                tids = os.listdir(task_dir)
            except OSError:
                self.pids.discard(pid)
                continue
            for tid in tids:
                try:
                    with open(task_dir / tid / "stat", "rb") as fh:
                        raw = fh.read()
                except OSError:
                    continue
                # the state is the first field after the command name's closing parenthesis
                close = raw.rfind(b")")
                if raw[close + 2 : close + 3] != b"D":
                    continue
                key = (pid, int(tid))
                self._names.setdefault(key, raw[raw.find(b"(") + 1 : close].decode("utf-8", "replace"))
                self._d.setdefault(key, Counter())[self._wchan(task_dir / tid)] += 1

    @staticmethod
    def _wchan(task: Path) -> str:
        try:
            with open(task / "wchan") as fh:
                text = fh.read().strip()
        except OSError:
            return ""
        return "" if text == "0" else text

    def _find_children(self) -> None:
        """Add the children of the processes followed (new DataLoader workers, a rank's children), from
        each thread's /proc/PID/task/TID/children (the kernel lists a child under the thread that forked
        it), to a fixed point: a few reads per process, not a scan of every process of the machine."""
        todo = list(self.pids)
        while todo:
            pid = todo.pop()
            task_dir = self.procfs.root / str(pid) / "task"
            try:
                tids = os.listdir(task_dir)
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(task_dir / tid / "children", "rb") as fh:
                        children = [int(c) for c in fh.read().split()]
                except (OSError, ValueError):
                    continue
                for child in children:
                    if child not in self.pids:
                        self.pids.add(child)
                        self.on_new(child)
                        todo.append(child)

    def io_waits(self) -> list[IoWait]:
        return [
            IoWait(pid, tid, self._names.get((pid, tid), ""), sum(c.values()), dict(c))
            for (pid, tid), c in sorted(self._d.items())
        ]

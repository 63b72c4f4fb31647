"""`py-spy record` over a job's process tree, with the thread states sampled beside it.

Always `--nonblocking`: py-spy then reads the target's memory without pausing it. A blocking record
ptrace-stops every thread of every process at each sample; a thread that enters D state meanwhile (a
DataLoader worker reading a file, a checkpoint's fsync) makes that pause wait for ever while every other
thread stays frozen (research/hang-diagnosis.md §1.6), and the cost grows with the thread count: 2.4x
slower at 65 threads and 100 Hz, hung at 200 Hz (research/slowness.md §5.3, py-spy#872). Reading without
pausing costs the job only py-spy's own CPU; the price is a stack now and then read mid-change (py-spy
counts it as an error and goes on).

`--subprocesses` on each root of the tree follows DataLoader workers, ranks and whatever they start during
the recording (research/slowness.md §5.5: the workers' `_worker_loop → __getitem__` frames are there).

py-spy drops a thread in D state as idle; `StateSampler` reads /proc/PID/task/*/stat of the same processes
at the same rate, and counts for each thread the ticks it spent in D and where (wchan), which
probes.profiledata turns into samples of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.osapi.procfs import ProcFS, parse_stat
from jobwarden.osapi.tool import ToolUnavailable, run_tool
from jobwarden.probes.profiledata import IoWait
from jobwarden.probes.pyspy import classify_error
from jobwarden.probes.stackbase import CaptureError, Failure

MAX_OUTPUT_BYTES = 256 << 20  # py-spy's speedscope file; more is not read (a bound on our memory)
STARTUP_S = 10.0  # py-spy attaching to a torch process, and writing its file at the end
RESCAN_S = 0.5  # how often the state sampler looks for new processes (py-spy looks every 0.1 s)


@dataclass
class Recording:
    speedscope: list[dict[str, Any]] = field(default_factory=list)  # one file per root
    io_waits: list[IoWait] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[CaptureError] = field(default_factory=list)
    state_ticks: int = 0


def record(
    binary: Path, roots: Sequence[int], rate_hz: int, duration_s: int, procfs: ProcFS, work_dir: Path
) -> Recording:
    """Record every root (with its descendants) for `duration_s` at `rate_hz`; the thread states of the
    same processes are sampled meanwhile. Never raises for a root that failed: said in `failures`."""
    result = Recording()
    sampler = StateSampler(procfs, roots, 1.0 / rate_hz)
    thread = threading.Thread(target=sampler.run, name="jobwarden-states", daemon=True)
    thread.start()
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(roots)), thread_name_prefix="py-spy") as pool:
            outcomes = list(
                pool.map(lambda pid: _record_one(binary, pid, rate_hz, duration_s, work_dir), roots)
            )
    finally:
        sampler.stop.set()
        thread.join()
    for outcome in outcomes:
        if isinstance(outcome, CaptureError):
            result.failures.append(outcome)
        else:
            data, notes = outcome
            result.speedscope.append(data)
            result.notes.extend(notes)
    result.io_waits = sampler.io_waits()
    result.state_ticks = sampler.ticks
    return result


def _record_one(
    binary: Path, pid: int, rate_hz: int, duration_s: int, work_dir: Path
) -> tuple[dict[str, Any], list[str]] | CaptureError:
    fd, name = tempfile.mkstemp(prefix=f"py-spy-{pid}-", suffix=".json", dir=work_dir)
    os.close(fd)
    out = Path(name)
    argv = [
        str(binary), "record", "--pid", str(pid), "--nonblocking", "--subprocesses",
        "--format", "speedscope", "--rate", str(rate_hz), "--duration", str(duration_s),
        "--output", str(out),
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

    def __init__(self, procfs: ProcFS, roots: Sequence[int], interval_s: float) -> None:
        self.procfs, self.interval_s = procfs, interval_s
        self.pids: set[int] = set(roots)
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
        """Add the processes whose parent is followed: new DataLoader workers, a rank's children."""
        try:
            pids = self.procfs.pids()
        except OSError:
            return
        parents: dict[int, int] = {}
        for pid in pids:
            if pid in self.pids:
                continue
            try:
                with open(self.procfs.root / str(pid) / "stat") as fh:
                    parents[pid] = parse_stat(fh.read()).ppid
            except (OSError, ValueError, IndexError):
                continue
        grew = True
        while grew:  # a grandchild read before its parent joined: to a fixed point
            grew = False
            for pid, ppid in list(parents.items()):
                if ppid in self.pids:
                    self.pids.add(pid)
                    del parents[pid]
                    grew = True

    def io_waits(self) -> list[IoWait]:
        return [
            IoWait(pid, tid, self._names.get((pid, tid), ""), sum(c.values()), dict(c))
            for (pid, tid), c in sorted(self._d.items())
        ]

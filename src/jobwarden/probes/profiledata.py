"""A sampled profile of a job's process tree, as data: py-spy's speedscope samples per thread, with the
samples jobwarden adds for threads it saw waiting on I/O, and what is said of them (the top list).

py-spy calls a thread idle whenever the kernel does not say it runs (`R`): a thread in D state (a disk
read, an fsync) is dropped from its samples like one waiting on a lock (research/slowness.md §5.7: "py-spy
dump labels the thread (idle)"). An I/O-bound job would look idle. The thread states are sampled beside
py-spy (probes.pyspyrecord), and each tick a thread spent in D becomes a sample of its own, whose frame
says so and names the kernel function it waits in (wchan).

Pure: no I/O. The speedscope format is https://www.speedscope.app/file-format-schema.json ("sampled").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

IO_WAIT = "(waiting on I/O)"  # the frame of a sample taken while the thread was in D state
SCHEMA = "https://www.speedscope.app/file-format-schema.json"
TOP_N = 20
_PYSPY_THREAD = re.compile(r"^(?:Process (\d+) )?Thread (\d+|0x[0-9A-Fa-f]+)(?: \"(.*)\")?$", re.S)
_OURS = re.compile(r"^pid (\d+) tid (\d+)(?: (.*))?$", re.S)


class ProfileFormatError(ValueError):
    """A speedscope file that is not what py-spy (or jobwarden) writes."""


@dataclass(frozen=True)
class FrameInfo:
    function: str
    file: str
    line: int | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.function, "file": self.file, "line": self.line}


@dataclass
class ThreadSamples:
    pid: int
    tid: int
    name: str
    stacks: list[tuple[int, ...]] = field(default_factory=list)  # frame indexes, outermost first
    weights: list[float] = field(default_factory=list)  # seconds each sample stands for

    def add(self, stack: tuple[int, ...], weight: float) -> None:
        if self.stacks and self.stacks[-1] == stack:  # run-length: a steady stack stays one entry
            self.weights[-1] += weight
            return
        self.stacks.append(stack)
        self.weights.append(weight)


@dataclass
class Profile:
    frames: list[FrameInfo] = field(default_factory=list)
    threads: dict[tuple[int, int], ThreadSamples] = field(default_factory=dict)
    _index: dict[FrameInfo, int] = field(default_factory=dict)

    def frame(self, info: FrameInfo) -> int:
        found = self._index.get(info)
        if found is None:
            found = self._index[info] = len(self.frames)
            self.frames.append(info)
        return found

    def thread(self, pid: int, tid: int, name: str = "") -> ThreadSamples:
        key = (pid, tid)
        if key not in self.threads:
            self.threads[key] = ThreadSamples(pid, tid, name)
        elif name and not self.threads[key].name:
            self.threads[key].name = name
        return self.threads[key]

    @property
    def seconds(self) -> float:
        """Sampled thread-seconds (each sample weighs one sampling interval)."""
        return sum(sum(t.weights) for t in self.threads.values())

    def processes(self) -> dict[int, float]:
        counts: dict[int, float] = {}
        for t in self.threads.values():
            counts[t.pid] = counts.get(t.pid, 0.0) + sum(t.weights)
        return counts

    def top(self, n: int = TOP_N, self_only: bool = False) -> list[dict[str, Any]]:
        """The functions with the largest inclusive share of the samples, across every thread of every
        process: a function counts once per sample however often it recurs in it. Each is named with the
        line it spent most samples on. `self_only`: the innermost frame of each sample only (where the
        time is spent, not what called it)."""
        total = self.seconds
        if total <= 0:
            return []
        share: dict[tuple[str, str], float] = {}
        lines: dict[tuple[str, str], dict[int | None, float]] = {}
        for t in self.threads.values():
            for stack, weight in zip(t.stacks, t.weights, strict=True):
                seen: set[tuple[str, str]] = set()
                for index in stack[-1:] if self_only else stack:
                    f = self.frames[index]
                    key = (f.function, f.file)
                    by_line = lines.setdefault(key, {})
                    by_line[f.line] = by_line.get(f.line, 0.0) + weight
                    if key not in seen:
                        seen.add(key)
                        share[key] = share.get(key, 0.0) + weight
        ranked = sorted(share.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [
            {
                "function": fn,
                "file": file,
                "line": max(lines[(fn, file)].items(), key=lambda kv: kv[1])[0],
                "fraction": round(min(1.0, weight / total), 4),
            }
            for (fn, file), weight in ranked
        ]

    def to_speedscope(self, name: str) -> dict[str, Any]:
        profiles = []
        for t in sorted(self.threads.values(), key=lambda t: (t.pid, t.tid)):
            total = sum(t.weights)
            profiles.append(
                {
                    "type": "sampled",
                    "name": f"pid {t.pid} tid {t.tid} {t.name}".rstrip(),
                    "unit": "seconds",
                    "startValue": 0,
                    "endValue": round(total, 6),
                    "samples": [list(s) for s in t.stacks],
                    "weights": [round(w, 6) for w in t.weights],
                }
            )
        return {
            "$schema": SCHEMA,
            "shared": {"frames": [f.to_json() for f in self.frames]},
            "profiles": profiles,
            "name": name,
            "exporter": "jobwarden",
            "activeProfileIndex": 0 if profiles else None,
        }


def from_speedscope(data: Mapping[str, Any], profile: Profile | None = None, pid: int = 0) -> Profile:
    """A speedscope file (py-spy's, or one jobwarden wrote) merged into `profile`; `pid`: the process a
    record of one process was of (its profiles' names give only the thread). Raises ProfileFormatError
    when it is not one."""
    profile = profile if profile is not None else Profile()
    try:
        frames = data["shared"]["frames"]
        runs = data["profiles"]
        if not isinstance(frames, list) or not isinstance(runs, list):
            raise TypeError("frames and profiles must be lists")
        local = [None if _synthetic(f) else profile.frame(_frame(f)) for f in frames]
        for run in runs:
            named, tid, name = _thread_of(str(run.get("name", "")))
            thread = profile.thread(named or pid, tid, name)
            for stack, weight in zip(run["samples"], run["weights"], strict=True):
                kept = tuple(i for i in (local[_index(j, len(local))] for j in stack) if i is not None)
                seconds = float(weight)
                if not 0 <= seconds < 1e9:  # NaN, infinite or negative: no sampler wrote it
                    raise ValueError(f"a sample weighs {weight!r}")
                thread.add(kept, seconds)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise ProfileFormatError(f"not a speedscope profile: {type(err).__name__}: {err}") from err
    return profile


def _index(raw: Any, size: int) -> int:
    index = int(raw)
    if not 0 <= index < size:
        raise IndexError(f"frame {index} of {size}")
    return index


def _synthetic(raw: Mapping[str, Any]) -> bool:
    """py-spy's own frames naming the process (`--subprocesses`) or the thread (`--threads`): the
    profile keeps both apart by itself, and they are no code of the job's."""
    name = str(raw.get("name", ""))
    return not raw.get("file") and (name.startswith("process ") or name.startswith("thread ("))


def _frame(raw: Mapping[str, Any]) -> FrameInfo:
    line = raw.get("line")
    return FrameInfo(str(raw["name"]), str(raw.get("file") or ""), int(line) if line else None)


def _thread_of(name: str) -> tuple[int, int, str]:
    """(pid, tid, thread name) from a profile's name: py-spy's `Process P Thread T "name"` (T may be a
    pthread id in hex when the OS id is unknown) or ours, `pid P tid T name`."""
    ours = _OURS.match(name)
    if ours:
        return int(ours.group(1)), int(ours.group(2)), ours.group(3) or ""
    theirs = _PYSPY_THREAD.match(name)
    if not theirs:
        raise ValueError(f"unexpected profile name {name[:80]!r}")
    tid = theirs.group(2)
    return (
        int(theirs.group(1) or 0),
        int(tid, 16) if tid.startswith("0x") else int(tid),
        theirs.group(3) or "",
    )


@dataclass(frozen=True)
class IoWait:
    """Ticks of the state sampler in which one thread was in D state, and where it waited."""

    pid: int
    tid: int
    name: str
    ticks: int
    wchan: Mapping[str, int]  # kernel function -> ticks


def add_io_waits(profile: Profile, waits: Iterable[IoWait], interval_s: float) -> float:
    """Each D-state tick as a sample of its thread: the thread's outermost frames when py-spy saw it
    (its Python stack while it waits is not known, its thread is) under one frame saying it waited on
    I/O, in which kernel function. The seconds added."""
    added = 0.0
    for wait in waits:
        thread = profile.thread(wait.pid, wait.tid, wait.name)
        for wchan, ticks in sorted(wait.wchan.items()):
            index = profile.frame(FrameInfo(IO_WAIT, f"kernel: {wchan}" if wchan else "kernel", None))
            thread.add((index,), ticks * interval_s)
            added += ticks * interval_s
    return added


def summary(profile: Profile, commands: Mapping[int, str], rate_hz: int) -> dict[str, Any]:
    """What `profile --json` says besides the job: samples, the processes, the top list."""
    per_process = profile.processes()
    return {
        "samples": round(profile.seconds * rate_hz),
        "processes": [
            {"pid": pid, "command": commands.get(pid, ""), "samples": round(seconds * rate_hz)}
            for pid, seconds in sorted(per_process.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "top": profile.top(),
        "hot": profile.top(5, self_only=True),
    }

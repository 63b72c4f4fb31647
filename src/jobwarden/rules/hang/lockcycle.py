"""Threads of one process that wait for each other's Python locks: a cycle among `with` statements.

py-spy shows where each thread stands, never which lock object it holds; probes.withlocks reads the
source around those lines (`LockSite`): the module-level lock a `with` on the thread's innermost line
waits to enter, and the ones whose `with` blocks hold the lines of its frames. A thread idle at
`with b:` inside `with a:`, while another idle thread stands at `with a:` inside `with b:`, is the
classic ABBA deadlock; the same for longer cycles. An instance's `self._lock` is one lock per object: an
edge only between frames whose `self` is the same object (Frame.owner, from the hang's dump). A lock
whose holder the source does not show (taken by `acquire()`), or an instance's whose objects were not
read, draws no edge, so no cycle is ever guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobwarden.observations import Frame, HeldLock, LockSite, ProcessStack, ThreadStack
from jobwarden.rules import frames


@dataclass(frozen=True)
class LockStep:
    thread: ThreadStack
    at: Frame  # where it waits: the `with` line
    lock: HeldLock  # the lock it waits to enter
    holder: ThreadStack
    held: HeldLock  # the holder's `with` of that lock


@dataclass(frozen=True)
class LockCycle:
    pid: int
    steps: tuple[LockStep, ...]

    @property
    def locks(self) -> list[str]:
        return [_lock_words(s.lock, s.at) for s in self.steps]


def lock_cycles(stacks: Sequence[ProcessStack], sites: Mapping[tuple[str, int], LockSite]) -> list[LockCycle]:
    """Each process's first cycle of threads waiting for each other's `with` locks."""
    found = []
    for ps in stacks:
        cycle = _cycle(ps, sites)
        if cycle:
            found.append(LockCycle(ps.pid, cycle))
    return found


def _cycle(ps: ProcessStack, sites: Mapping[tuple[str, int], LockSite]) -> tuple[LockStep, ...]:
    idle = [t for t in ps.threads if t.active is False]
    waiting: dict[int, tuple[Frame, HeldLock, _Key]] = {}
    holding: dict[_Key, list[tuple[int, HeldLock]]] = {}
    for n, thread in enumerate(idle):
        py = [f for f in thread.frames if not f.native and f.line]
        if not py:
            continue
        inner = sites.get((py[0].file, py[0].line or 0))
        wanted = _key(py[0], inner.takes) if inner is not None and inner.takes is not None else None
        if inner is not None and inner.takes is not None and wanted is not None:
            waiting[n] = (py[0], inner.takes, wanted)
        for frame in py:
            site = sites.get((frame.file, frame.line or 0))
            for held in site.holds if site else ():
                key = _key(frame, held)
                if key is not None:
                    holding.setdefault(key, []).append((n, held))
    edges: dict[int, LockStep] = {}
    for n, (at, lock, key) in waiting.items():
        holders = {h for h in holding.get(key, ()) if h[0] != n}
        if len({h[0] for h in holders}) == 1:  # a Lock has one holder: two would mean the text misleads
            holder, held = min(holders, key=lambda h: h[1].with_line)
            edges[n] = LockStep(idle[n], at, lock, idle[holder], held)
    for start in sorted(edges):
        path = [start]
        while path[-1] in edges:
            nxt = idle.index(edges[path[-1]].holder)
            if nxt in path:
                loop = path[path.index(nxt) :]
                first = min(range(len(loop)), key=lambda i: idle[loop[i]].tid or 0)  # said from the oldest
                return tuple(edges[n] for n in loop[first:] + loop[:first])
            path.append(nxt)
    return ()


_Key = tuple[str, str, int | None]  # a lock's identity: its file, its name, the object of an instance's


def _key(frame: Frame, lock: HeldLock) -> _Key | None:
    """Which lock a frame's `with` takes: a module's by its name, an instance's by its name and the
    object the method runs on (its `self`, where the dump read it; else no edge is drawn)."""
    if not lock.attribute:
        return frame.file, lock.name, None
    return (frame.file, lock.name, frame.owner) if frame.owner is not None else None


def _lock_words(lock: HeldLock, at: Frame) -> str:
    """'a', or 'self._lock of object 0x7f3a...' for an instance's lock."""
    return f"{lock.name} of object {at.owner:#x}" if lock.attribute and at.owner is not None else lock.name


def thread_name(thread: ThreadStack) -> str:
    label = f"thread {thread.tid}" if thread.tid is not None else "a thread"
    return f'{label} "{thread.name}"' if thread.name else label


def lock_name(step: LockStep) -> str:
    return f"lock {_lock_words(step.lock, step.at)} (made at line {step.lock.defined})"


def cycle_title(cycle: LockCycle) -> str:
    return (
        f"Deadlock: {len(cycle.steps)} threads of pid {cycle.pid} wait for each other's locks "
        f"({', '.join(sorted(set(cycle.locks)))})"
    )


def cycle_summary(cycle: LockCycle) -> str:
    """Each thread, the line it waits at, the lock, and who holds it since which `with`; a file is named
    once, until the cycle goes into another."""
    parts, file = [], ""
    for s in cycle.steps:
        where = f"line {s.at.line}" if s.at.file == file else f"{frames.short_file(s.at.file)}:{s.at.line}"
        file = s.at.file
        parts.append(
            f"{thread_name(s.thread)} waits at {where} for {lock_name(s)}, which {thread_name(s.holder)}"
            f" holds (its `with` at line {s.held.with_line})"
        )
    return "; ".join(parts) + ": a cycle, nobody can go on (a deadlock)"


def cycle_evidence(cycle: LockCycle) -> list[str]:
    return [
        f"pid {cycle.pid} {thread_name(s.thread)} is idle at {frames.where(s.at)}, `with {s.lock.name}:`; "
        f"{thread_name(s.holder)} is inside its `with {s.held.name}:` "
        f"({frames.short_file(s.at.file)}:{s.held.with_line})"
        for s in cycle.steps
    ]


def cycle_remedy(cycle: LockCycle, job: str) -> str:
    order = " before ".join(sorted(set(cycle.locks)))
    return (
        f"Take the locks in one order everywhere (say {order}), or guard the data with one lock; "
        "`lock.acquire(timeout=...)` fails where a `with` waits for ever. Restart the job to get it "
        f"moving (`jobwarden stop {job}`, then `jobwarden resume {job}`)."
    )

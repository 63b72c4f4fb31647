"""Threads waiting for RLocks whose owner Python itself records: who holds each, and what that one does.

A thread idle at `with NAME:` (or `NAME.acquire()`) of a local name (probes.withlocks: LockSite.takes_local)
whose frame's locals bind NAME to an RLock (py-spy --locals) waits for that lock; its owner, read from the
process's memory (probes.rlocks), names the thread holding it, by the ident py-spy reports as each
thread's `thread_id`. From the waiter to the owner, and on if the owner itself waits for such a lock: a
cycle is a deadlock, else the chain ends at a thread that holds the lock and waits for something else
(hang.waits follows that thread's kernel wait on: a pipe, a child, a file lock), or at an owner no longer
among the process's threads (it ended holding the lock).

Only a lock Python reports an owner for draws an edge: a plain Lock records none, and a lock named by no
local (a module's, an instance's) is hang.lockcycle's, from the source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobwarden.observations import Frame, LocalRLock, LockSite, ProcessStack, ThreadStack
from jobwarden.rules import frames
from jobwarden.rules.hang.lockcycle import thread_name


@dataclass(frozen=True)
class RLockStep:
    thread: ThreadStack  # the waiter
    at: Frame  # its frame at the line that takes the lock
    lock: LocalRLock
    holder: ThreadStack | None  # None: the owner is no thread of the dump (it ended holding the lock)


@dataclass(frozen=True)
class RLockChain:
    pid: int
    steps: tuple[RLockStep, ...]
    cycle: bool

    @property
    def holder(self) -> ThreadStack | None:
        """The thread everything waits for (a chain's last owner; None when it ended or in a cycle)."""
        return None if self.cycle else self.steps[-1].holder


def rlock_chains(
    stacks: Sequence[ProcessStack], sites: Mapping[tuple[str, int], LockSite]
) -> list[RLockChain]:
    """Each process's RLock chain: its first cycle, else its longest chain (from the oldest waiter)."""
    found = []
    for ps in stacks:
        edges = _edges(ps, sites)
        chain = _cycle(ps.pid, edges) or _longest(ps.pid, edges)
        if chain is not None:
            found.append(chain)
    return found


def _edges(ps: ProcessStack, sites: Mapping[tuple[str, int], LockSite]) -> dict[int, RLockStep]:
    """Each idle thread that waits for an RLock another thread owns, by its index among the threads."""
    edges = {}
    for n, thread in enumerate(ps.threads):
        if thread.active is not False or thread.ident is None:
            continue
        py = [f for f in thread.frames if not f.native and f.line]
        site = sites.get((py[0].file, py[0].line or 0)) if py else None
        if site is None or not site.takes_local:
            continue
        lock = next((r for r in py[0].rlocks if r.name == site.takes_local), None)
        if lock is None or not lock.owner or lock.owner == thread.ident:
            continue  # free (it is about to take it), unread, or its own (an RLock does not block its owner)
        holder = next((t for t in ps.threads if t.ident == lock.owner), None)
        edges[n] = RLockStep(thread, py[0], lock, holder)
    return edges


def _cycle(pid: int, edges: Mapping[int, RLockStep]) -> RLockChain | None:
    for start in sorted(edges):
        path = _path(start, edges)
        last = _holder_index(edges[path[-1]], edges)
        if last is not None and last in path:
            loop = path[path.index(last) :]
            first = min(range(len(loop)), key=lambda i: edges[loop[i]].thread.tid or 0)  # from the oldest
            return RLockChain(pid, tuple(edges[n] for n in loop[first:] + loop[:first]), cycle=True)
    return None


def _path(start: int, edges: Mapping[int, RLockStep]) -> list[int]:
    """From a waiter, owner after owner, while the owner itself waits and is not on the path yet."""
    path = [start]
    while True:
        nxt = _holder_index(edges[path[-1]], edges)
        if nxt is None or nxt in path:
            return path
        path.append(nxt)


def _holder_index(step: RLockStep, edges: Mapping[int, RLockStep]) -> int | None:
    """The holder's own edge, where it waits for an RLock too."""
    return next((n for n, s in edges.items() if s.thread is step.holder), None)


def _longest(pid: int, edges: Mapping[int, RLockStep]) -> RLockChain | None:
    best = max((_path(start, edges) for start in sorted(edges)), key=len, default=[])
    return RLockChain(pid, tuple(edges[n] for n in best), cycle=False) if best else None


# --- words ------------------------------------------------------------------------------------------


def lock_words(step: RLockStep) -> str:
    """'RLock `second` at 0x7f3a...'."""
    return f"RLock `{step.lock.name}` at {step.lock.address:#x}"


def holder_words(step: RLockStep) -> str:
    """'thread 813 "two"', or what is known of an owner that is no thread any more."""
    if step.holder is None:
        return f"thread ident {step.lock.owner}, which is no longer running (it ended holding the lock)"
    return thread_name(step.holder)


def step_words(step: RLockStep, file: str = "") -> str:
    """'waits at dl.py:6 for RLock `second` at 0x.. held by thread 813 "two"' (the file named once)."""
    where = (
        f"line {step.at.line}"
        if step.at.file == file
        else f"{frames.short_file(step.at.file)}:{step.at.line}"
    )
    return f"waits at {where} for {lock_words(step)} held by {holder_words(step)}"


def chain_words(chain: RLockChain) -> str:
    """'thread 812 "one" waits at ... held by thread 813 "two", which waits at ... held by ...'."""
    parts, file = [], ""
    for n, s in enumerate(chain.steps):
        parts.append(f"{thread_name(s.thread) if n == 0 else 'which'} {step_words(s, file)}")
        file = s.at.file
    return ", ".join(parts)


def chain_evidence(chain: RLockChain) -> list[str]:
    lines = []
    for s in chain.steps:
        count = f", taken {s.lock.count} time{'s' if s.lock.count != 1 else ''}" if s.lock.count else ""
        lines.append(
            f"pid {chain.pid} {thread_name(s.thread)} is idle at {frames.where(s.at)}, taking `{s.lock.name}`"
            f" (an RLock at {s.lock.address:#x}); its owner, as the process's memory records it: thread "
            f"ident {s.lock.owner}{count} ({holder_words(s)})"
        )
    return lines


def doing(thread: ThreadStack, sleeping: bool = False) -> str:
    """What a holder does, from its stack (and the kernel's word that it sleeps): 'sleeps at f (x.py:3)',
    'is idle at f (x.py:3)', 'runs f (x.py:3)'."""
    py = [f for f in thread.frames if not f.native and f.line]
    own = next((f for f in py if not frames.is_library(f)), None) or (py[0] if py else None)
    verb = "sleeps at" if sleeping else "runs" if thread.active else "is idle at"
    if own is None:
        return "sleeps" if sleeping else "shows no Python frame"
    return f"{verb} {frames.where(own)}"

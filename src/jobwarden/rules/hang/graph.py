"""The wait-for graph's edges, whoever draws them: one thread's wait, what it is on, who is on its far side.

The kernel draws most (probes.waits: a child, a file lock, a pipe, a socket: `Edge.of`); `follow` walks
them from one process to the process everything waits for (rules.hang.waits). The stacks draw the edges
the kernel cannot show, and the hang signatures are such edges, each of one shape, whose far side says
why it never ends:

- `pool-worker-lost`: a thread waits for a pool's result whose only feeder, the worker that ran the
  task, died (kind "pool-result", far side "died");
- `fork-deadlock`: a thread of a forked child waits for a lock whose holder thread does not exist in
  this process: it stayed in the parent at the fork ("lock", far side "absent");
- `collective-hang`: a rank waits in a collective for a peer that is not in it ("collective");
- `uninterruptible-io`: a thread waits in the kernel itself (D state) for no process ("kernel", far
  side "none").

A signature fires on its edges (each rule's `edges` and `from_edges`), before `wait-chain`, which says
the rest; its finding says the chain as the graph sees it (`chain_line`): the kernel's steps from the
main process that lead to the signature's waiter (`lead_in`: a wrapper waiting for its child), then the
signature's edge, then the process everything waits for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from jobwarden.observations import Frame, Wait, WaitParty
from jobwarden.rules.lookup import Lookup, describe

KERNEL_KINDS = ("child", "file-lock", "pipe-read", "pipe-write", "socket-read")  # a far side the kernel names
MAX_STEPS = 16  # a chain longer than this is cut: its first steps say enough


@dataclass(frozen=True)
class Edge:
    """One thread's wait. `far` says how the far side stands: "live" (it may still answer), "died" (the
    process on it is gone), "absent" (the holder is a thread this process does not have), "none" (no
    process: the kernel, a device)."""

    pid: int
    tid: int | None
    kind: str  # a kernel kind ("child", "file-lock"...), or "pool-result", "lock", "collective", "kernel"
    thing: str  # what it waits on: "/data/cache.lock", "pipe:[81234]", "Pool.map (multiprocessing/pool.py:3)"
    on: tuple[int, ...] = ()  # the processes on the far side
    far: str = "live"
    call: str = ""  # the system call of a kernel wait
    at: Frame | None = field(default=None, compare=False)  # the waiting thread's frame, where stacks show it

    @classmethod
    def of(cls, wait: Wait) -> Edge:
        return cls(wait.pid, wait.tid, wait.kind, wait.thing, wait.on, call=wait.call)


@dataclass(frozen=True)
class Step:
    wait: Edge
    to: int  # the process on the other side


@dataclass(frozen=True)
class Chain:
    steps: tuple[Step, ...]
    cycle: bool  # the last step leads back to a process already on the path

    @property
    def end(self) -> int:
        return self.steps[-1].to


def follow(start: int, waits: Sequence[Wait], first: Wait | None = None) -> Chain | None:
    """The path of the kernel's edges from `start`'s (or from `first`, one of its threads' waits) to its
    end, or None when `start` waits on nothing with a far side."""
    by_pid = _edge_of_each_process(waits)
    if first is not None:
        by_pid[start] = Edge.of(first)
    steps: list[Step] = []
    seen = [start]
    pid = start
    while pid in by_pid and len(steps) < MAX_STEPS:
        edge = by_pid[pid]
        if not edge.on:  # a lock whose holder, a pipe whose other end, the kernel did not show
            break
        to = _next(edge, seen, by_pid)
        steps.append(Step(edge, to))
        if to in seen:
            return Chain(tuple(steps), cycle=True)
        seen.append(to)
        pid = to
    return Chain(tuple(steps), cycle=False) if steps else None


def lead_in(start: int | None, waits: Sequence[Wait], target: int) -> tuple[Step, ...]:
    """The kernel's steps from `start` (the main process) that lead to `target` (a signature's waiter):
    a wrapper waiting for its child, and on; none where `start` is `target` or the chain misses it."""
    chain = follow(start, waits) if start is not None and start != target else None
    steps: list[Step] = []
    for step in chain.steps if chain is not None else ():
        steps.append(step)
        if step.to == target:
            return tuple(steps)
    return ()


def _edge_of_each_process(waits: Sequence[Wait]) -> dict[int, Edge]:
    """Each process's wait that leads somewhere: its main thread's first (that is the one the run waits
    on), else another thread's."""
    found: dict[int, Edge] = {}
    for w in sorted(waits, key=lambda w: (w.pid, w.tid != w.pid, w.tid)):
        if w.kind in KERNEL_KINDS and w.on and w.pid not in found:
            found[w.pid] = Edge.of(w)
    return found


def _next(edge: Edge, seen: Sequence[int], by_pid: Mapping[int, Edge]) -> int:
    """Which of the processes on the far side to follow: one that itself waits on another first (the
    chain goes on through it), then one already on the path (a cycle), then the lowest pid."""
    others = [p for p in edge.on if p != edge.pid] or list(edge.on)
    return min(others, key=lambda p: (p not in by_pid or p in seen, p not in seen, p))


# --- words ------------------------------------------------------------------------------------------


class Names:
    """A process in words: its command, and whose it is where it is outside the job."""

    def __init__(self, look: Lookup, parties: Mapping[int, WaitParty]) -> None:
        self.look, self.parties = look, parties

    def of(self, pid: int, width: int = 60) -> str:
        party = self.parties.get(pid)
        cmdline = self.look.cmdline(pid) if pid in self.look.processes else party.cmdline if party else ""
        return describe(pid, cmdline, width)

    def whose(self, pid: int) -> str:
        """', user bob, not a job of yours' for a process outside the job that is none of this user's
        jobs; ', of your job 12 "prep-data"' for one of this user's other jobs."""
        party = self.parties.get(pid)
        if party is None or party.in_job:
            return ""
        if party.job is not None:
            return f', of your job {party.job} "{party.job_name[:64]}"'
        return f", user {party.user}, not a job of yours"

    def outside(self, pid: int) -> bool:
        party = self.parties.get(pid)
        return party is not None and not party.in_job


def what(step: Step, name: Names, short: bool = False) -> str:
    """What one kernel wait is, in words, naming the process on its far side."""
    w, to = step.wait, step.to
    # a process outside the job is named with its command even in a title: the reader may not know it
    who = name.of(to, 40) if not short or name.outside(to) else f"pid {to}"
    whose = name.whose(to)
    if w.kind == "file-lock":
        return f"waits for a file lock on {w.thing} held by {who}{whose}"
    if w.kind == "pipe-read":
        if to == w.pid:
            return f"reads a pipe ({w.thing}) whose write end it holds open itself"
        return f"reads {pipe(w, 'a pipe', 'the FIFO')} whose write end {who}{whose} still holds open"
    if w.kind == "pipe-write":
        return f"writes into {pipe(w, 'a full pipe', 'the full FIFO')} that {who}{whose} does not read"
    if w.kind == "socket-read":
        return f"waits for a reply on {w.thing} from {who}{whose}"
    return f"waits for its child {who}"


def pipe(edge: Edge | Wait, anonymous: str, named: str) -> str:
    """A pipe in words: a FIFO by its path, an anonymous pipe as such (its inode says nothing)."""
    return anonymous if edge.thing.startswith("pipe:[") else f"{named} {edge.thing}"


def signature_words(edge: Edge) -> str:
    """What a signature's edge is, in words: 'waits in Pool.map (...) for a result of pid 812'."""
    to = f"pid{'s' if len(edge.on) > 1 else ''} {', '.join(str(p) for p in edge.on)}" if edge.on else ""
    if edge.kind == "pool-result":
        return f"waits in {edge.thing} for a result of {to}"
    if edge.kind == "lock":
        holder = f"a thread that stayed in {to} at the fork" if edge.far == "absent" and to else "a thread"
        return f"waits for a lock at {edge.thing} held by {holder}"
    if edge.kind == "collective":
        verb = "are" if len(edge.on) > 1 else "is"
        return f"waits in {edge.thing} for {to or 'a peer on another machine'}, which {verb} not in it"
    return f"waits in the kernel ({edge.thing}) for no process"


def chain_line(steps: Sequence[Step], edge: Edge, name: Callable[[int], str], end: str) -> str:
    """The graph's chain as one evidence line: the kernel's steps that lead to the signature's waiter,
    its edge, and how it ends (`end`: 'pid 812 was killed by SIGKILL: nobody will send it')."""
    parts = [f"{name(s.wait.pid) if n == 0 else 'which'} {_short(s)}" for n, s in enumerate(steps)]
    other_thread = edge.tid is not None and edge.tid != edge.pid
    if steps:
        parts.append(f"whose thread {edge.tid}" if other_thread else "which")
    else:
        parts.append(f"thread {edge.tid} of {name(edge.pid)}" if other_thread else name(edge.pid))
    parts[-1] += f" {signature_words(edge)}"
    return f"wait-for graph: {', '.join(parts)}; {end}"


def _short(step: Step) -> str:
    return what(step, Names(Lookup(), {}), short=True)

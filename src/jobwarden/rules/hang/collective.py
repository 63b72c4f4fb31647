"""`collective-hang`: ranks wait in a collective (all_reduce, barrier...) that a peer never joins.

The best evidence is each rank's PyTorch flight recorder, which the shim asks every rank for on a hang
(probes.flightrec): the first collective where the ranks' sequences part names the rank the others wait
for, and the call it made instead (rules.hang.desync).

Without it, the stacks: the signature is that the ranks disagree (docs/measurements.md, "Collective hang"):
some sit in torch.distributed / c10d / NCCL / gloo frames, at least one is elsewhere, or in another
collective than the others. That one is the lead: its stack shows what it does instead. Each waiting
rank is an edge of the wait-for graph (rules.hang.graph): it waits in the collective for the peers that
are not in that call. Either way it fires only when the watchdog judged the run hung (a collective is
also where healthy ranks spend their time). PyTorch's own NCCL watchdog messages in the output fire it
at any time: they are that watchdog's verdict that a collective timed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobwarden.model import Finding
from jobwarden.observations import Frame, ProcessStack, ThreadStack
from jobwarden.rules import frames
from jobwarden.rules.evidence import RunEvidence, job_ref
from jobwarden.rules.hang import graph, recorded
from jobwarden.rules.hang.graph import Edge
from jobwarden.rules.lookup import Lookup, count, describe

_PY_COLLECTIVE = "torch/distributed/distributed_c10d.py"
_NATIVE_COLLECTIVE = ("c10d::", "ProcessGroupNCCL", "ProcessGroupGloo", "nccl", "gloo::")
_WATCHDOG_LINES = (
    "Watchdog caught collective operation timeout",
    "watchdog got stuck",
    "NCCL communicator was aborted",
    "ncclSystemError",
    "ncclRemoteError",
)


@dataclass(frozen=True)
class InCollective:
    stack: ProcessStack
    thread: ThreadStack
    op: Frame  # the collective's frame: all_reduce (distributed_c10d.py:3252), or a native c10d/NCCL frame


def collective_hang(ev: RunEvidence) -> Finding | None:
    return from_edges(ev, collective_edges(ev))


def collective_edges(ev: RunEvidence) -> list[Edge]:
    """The wait-for graph's edges of this signature: each rank that waits in a collective, to the peers
    not in that call: its siblings elsewhere and the ranks in another collective; a rank in another
    collective than the most, to the ranks in the most."""
    if ev.hang_window_s is None:
        return []
    look = Lookup.of(ev)
    waiting = [c for s in look.live_stacks() if (c := _in_collective(s)) is not None]
    expected = _expected_op(look, waiting)
    strays = [c.stack.pid for c in waiting if frames.name(c.op) != expected]
    in_it = [c.stack.pid for c in waiting if frames.name(c.op) == expected]
    leads = [*(s.pid for s in _elsewhere(look, waiting)), *strays]
    return [
        Edge(
            c.stack.pid,
            c.thread.tid,
            "collective",
            frames.name(c.op),
            tuple(in_it if c.stack.pid in strays else leads),
            at=c.op,
        )
        for c in waiting
    ]


def from_edges(ev: RunEvidence, edges: Sequence[Edge]) -> Finding | None:
    """`collective-hang` from the graph's edges (ranks waiting in a collective for peers not in it), or
    from the ranks' flight recorders where they show where the ranks part, or from PyTorch's watchdog."""
    look = Lookup.of(ev)
    watchdog = [line.strip() for line in ev.log_tail if any(w in line for w in _WATCHDOG_LINES)]
    waiting = []
    if ev.hang_window_s is not None:
        found = recorded.finding(ev, look, _remedy_tail(job_ref(ev)))
        if found is not None:
            return found
        waiting = [c for e in edges if e.kind == "collective" and (c := _waiting(look, e)) is not None]
    if not waiting and not watchdog:
        return None
    expected = _expected_op(look, waiting)
    strays = [c for c in waiting if frames.name(c.op) != expected]
    in_it = [c for c in waiting if frames.name(c.op) == expected]
    waiters = {c.stack.pid for c in waiting}
    peers = dict.fromkeys(p for e in edges for p in e.on if p not in waiters)
    elsewhere = [look.stacks[pid] for pid in peers if pid in look.stacks]
    evidence = [_waiting_line(look, c) for c in [*strays, *in_it][:8]]
    evidence += [f"{describe(s.pid, look.cmdline(s.pid))} is elsewhere: {_at(s)}" for s in elsewhere]
    evidence += [f"output: {line}" for line in watchdog[-3:]]
    op = expected or "a collective"
    leads = [*(s.pid for s in elsewhere), *(c.stack.pid for c in strays)]
    steps: tuple[graph.Step, ...] = ()
    if waiting:
        edge = next((e for e in edges if e.pid == in_it[0].stack.pid), None) if in_it else None
        edge = edge or next(e for e in edges if e.pid == waiting[0].stack.pid)
        steps = graph.lead_in(ev.pid, ev.waits, edge.pid)
        if leads or steps:
            ends = _ends(look, elsewhere, strays)
            evidence.append(graph.chain_line(steps, edge, lambda p: _named(look, p), ends))
    return Finding(
        "collective-hang",
        _title(look, op, in_it, strays, bool(elsewhere)),
        _summary(look, in_it, strays, elsewhere, op, bool(watchdog)),
        "error",
        tuple(evidence),
        _remedy(look, leads, job_ref(ev)),
        # the rank that is elsewhere, or in another collective, first: the finding is about it
        tuple(dict.fromkeys([*leads, *(c.stack.pid for c in in_it)])),
    )


def _waiting(look: Lookup, edge: Edge) -> InCollective | None:
    stack = look.stacks.get(edge.pid)
    thread = next((t for t in stack.threads if t.tid == edge.tid), None) if stack is not None else None
    op = (edge.at or _op(thread)) if thread is not None else None
    return InCollective(stack, thread, op) if stack is not None and thread is not None and op else None


def _named(look: Lookup, pid: int) -> str:
    rank = look.processes[pid].rank if pid in look.processes else None
    return describe(pid, look.cmdline(pid), 40) + (f" (rank {rank})" if rank is not None else "")


def _ends(look: Lookup, elsewhere: Sequence[ProcessStack], strays: Sequence[InCollective]) -> str:
    """How the chain ends: at the peer everything waits for, or off this machine."""
    if elsewhere:
        lead = _lead(look, elsewhere[0].pid)
        return f"{lead} is elsewhere, at {_at(elsewhere[0])}: everything waits for it"
    if strays:
        lead = _lead(look, strays[0].stack.pid)
        return f"{lead} waits in {frames.name(strays[0].op)} instead: everything waits for it"
    return "no local rank is elsewhere: the chain leaves this machine"


def collective_of(stacks: Sequence[ProcessStack]) -> str | None:
    """The collective the first waiting process sits in ("all_reduce"), for a rank's group record."""
    waiting = next((c for s in stacks if (c := _in_collective(s)) is not None), None)
    return frames.name(waiting.op) if waiting else None


def _in_collective(stack: ProcessStack) -> InCollective | None:
    for thread in stack.threads:
        op = _op(thread)
        if op is not None:
            return InCollective(stack, thread, op)
    return None


def _op(thread: ThreadStack) -> Frame | None:
    py = next((f for f in thread.frames if not f.native and frames.is_in(f, _PY_COLLECTIVE)), None)
    native = next((f for f in thread.frames if f.native and _native_collective(f)), None)
    return py if py is not None else native


def _native_collective(frame: Frame) -> bool:
    return any(marker in frame.function for marker in _NATIVE_COLLECTIVE)


def _expected_op(look: Lookup, waiting: list[InCollective]) -> str | None:
    """The collective most waiting ranks sit in; as many in each: all_reduce (every data-parallel step
    calls it: a rank in another one took another branch), else the lowest rank's."""
    by_op: dict[str, int] = {}
    for c in sorted(waiting, key=lambda c: _rank_order(look, c.stack.pid)):
        by_op[frames.name(c.op)] = by_op.get(frames.name(c.op), 0) + 1
    if not by_op:
        return None
    most = max(by_op.values())
    tied = [op for op, n in by_op.items() if n == most]
    return "all_reduce" if len(tied) > 1 and "all_reduce" in tied else tied[0]


def _rank_order(look: Lookup, pid: int) -> tuple[int, int]:
    rank = look.processes[pid].rank if pid in look.processes else None
    return (rank if rank is not None else 1 << 62, pid)


def _who(look: Lookup, pids: list[int]) -> str:
    """'rank 1', 'ranks 0 and 1', 'pid 42' where the process has no rank."""
    ranks = [look.processes[p].rank if p in look.processes else None for p in pids]
    if pids and all(r is not None for r in ranks):
        return recorded.ranks_text(sorted(r for r in ranks if r is not None))
    return "pid " + ", ".join(str(p) for p in pids)


def _elsewhere(look: Lookup, waiting: list[InCollective]) -> list[ProcessStack]:
    """The peers of the waiting ranks (their siblings: the launcher starts every rank) that are not in it."""
    in_it = {c.stack.pid for c in waiting}
    parents = {look.processes[pid].ppid for pid in in_it if pid in look.processes}
    peers = [p.pid for p in look.processes.values() if p.ppid in parents and p.pid not in in_it]
    return [look.stacks[pid] for pid in peers if pid in look.stacks]


def _at(stack: ProcessStack) -> str:
    thread = frames.main_thread(stack)
    if thread is None or not thread.frames:
        return "no stack"
    site = frames.call_site(thread)
    top = frames.path_of(thread.frames, 2)
    return f"{top}" + (f" (its code: {frames.where(site)})" if site and site is not thread.frames[0] else "")


def _waiting_line(look: Lookup, c: InCollective) -> str:
    site = frames.call_site(c.thread)
    called = f", called from {frames.where(site)}" if site else ""
    rank = look.processes[c.stack.pid].rank if c.stack.pid in look.processes else None
    who = f"pid {c.stack.pid}" + (f" (rank {rank})" if rank is not None else "")
    return f"{who} waits in {frames.where(c.op)}{called}"


def _title(
    look: Lookup, op: str, in_it: list[InCollective], strays: list[InCollective], elsewhere: bool
) -> str:
    if strays and not elsewhere:  # a rank outside any collective leads: the title must name what pids[0] is
        stray_ops = sorted({frames.name(c.op) for c in strays})
        who = _who(look, [c.stack.pid for c in strays])
        verb = "wait" if len(strays) > 1 else "waits"
        others = _who(look, [c.stack.pid for c in in_it])
        other_verb = "wait" if len(in_it) > 1 else "waits"
        stray = " and ".join(stray_ops)
        return f"{who[:1].upper()}{who[1:]} {verb} in {stray} where {others} {other_verb} in {op}"
    return f"Hung in {op}: the ranks disagree" if elsewhere else f"Hung in {op}"


def _summary(
    look: Lookup,
    in_it: list[InCollective],
    strays: list[InCollective],
    elsewhere: list[ProcessStack],
    op: str,
    watchdog: bool,
) -> str:
    ranks = count(len(in_it), "rank") + (" waits" if len(in_it) == 1 else " wait")
    if strays:
        who = _who(look, [c.stack.pid for c in strays])
        return (
            f"{ranks} in {op} while {who} waits in another collective: the ranks took different code paths, "
            "and each waits for peers that will never join its call. Which side strayed is judged from the "
            "stacks alone (the fewer ranks, or the one not in all_reduce); the flight recorder would say at "
            "which collective they parted."
        )
    if in_it and elsewhere:
        pids = ", ".join(str(s.pid) for s in elsewhere)
        return (
            f"{ranks} in {op} for peers that never joined: pid {pids} is elsewhere, and its stack shows what "
            "it does instead."
        )
    if in_it:
        return (
            f"{ranks} in {op} and no local rank is elsewhere: the missing peer is on another machine, took "
            "a different code path earlier, or the network/NCCL transport stalled."
        )
    assert watchdog
    return "PyTorch's NCCL watchdog reported a collective that timed out: a rank never joined it."


def _remedy(look: Lookup, leads: list[int], job: str) -> str:
    lead = (
        f"Start with {_lead(look, leads[0])}: the rank that is not in the collective the others wait in is "
        "the cause, the waiting ones are victims. "
        if leads
        else ""
    )
    return lead + _remedy_tail(job)


def _lead(look: Lookup, pid: int) -> str:
    rank = look.processes[pid].rank if pid in look.processes else None
    return f"pid {pid}" if rank is None else f"rank {rank} (pid {pid})"


def _remedy_tail(job: str) -> str:
    return (
        f"Dump every rank at the same moment (`jobwarden dump {job}`) and compare where each is; PyTorch's "
        "flight recorder (on in jobwarden's Python jobs unless TORCH_FR_BUFFER_SIZE or "
        "TORCH_NCCL_TRACE_BUFFER_SIZE says otherwise; TORCH_NCCL_DUMP_ON_TIMEOUT=1 dumps it at a timeout) "
        "reads with `python -m torch.distributed.flight_recorder.fr_trace`; pass timeout= to "
        "init_process_group so a stuck collective fails instead of hanging."
    )

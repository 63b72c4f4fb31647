"""`collective-hang`: ranks wait in a collective (all_reduce, barrier...) that a peer never joins.

The signature is that the ranks disagree (docs/measurements.md, "Collective hang"): some sit in
torch.distributed / c10d / NCCL / gloo frames, at least one is elsewhere. That one is the lead: its stack
shows what it does instead.
From stacks it fires only when the watchdog judged the run hung (a collective is also where healthy ranks
spend their time). PyTorch's own NCCL watchdog messages in the output fire it at any time: they are that
watchdog's verdict that a collective timed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobwarden.model import Finding
from jobwarden.observations import Frame, ProcessStack, ThreadStack
from jobwarden.rules import frames
from jobwarden.rules.evidence import RunEvidence, job_ref
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
    look = Lookup.of(ev)
    watchdog = [line.strip() for line in ev.log_tail if any(w in line for w in _WATCHDOG_LINES)]
    waiting = []
    if ev.hang_window_s is not None:
        waiting = [c for s in look.live_stacks() if (c := _in_collective(s)) is not None]
    if not waiting and not watchdog:
        return None
    elsewhere = _elsewhere(look, waiting)
    evidence = [_waiting_line(c) for c in waiting[:8]]
    evidence += [f"{describe(s.pid, look.cmdline(s.pid))} is elsewhere: {_at(s)}" for s in elsewhere]
    evidence += [f"output: {line}" for line in watchdog[-3:]]
    op = frames.name(waiting[0].op) if waiting else "a collective"
    return Finding(
        "collective-hang",
        f"Hung in {op}: the ranks disagree" if elsewhere else f"Hung in {op}",
        _summary(waiting, elsewhere, op, bool(watchdog)),
        "error",
        tuple(evidence),
        _remedy(elsewhere, job_ref(ev)),
        # the rank that is elsewhere first: it is the one the finding is about
        tuple(dict.fromkeys([*(s.pid for s in elsewhere), *(c.stack.pid for c in waiting)])),
    )


def collective_of(stacks: Sequence[ProcessStack]) -> str | None:
    """The collective the first waiting process sits in ("all_reduce"), for a rank's group record."""
    waiting = next((c for s in stacks if (c := _in_collective(s)) is not None), None)
    return frames.name(waiting.op) if waiting else None


def _in_collective(stack: ProcessStack) -> InCollective | None:
    for thread in stack.threads:
        py = next((f for f in thread.frames if not f.native and frames.is_in(f, _PY_COLLECTIVE)), None)
        native = next((f for f in thread.frames if f.native and _native_collective(f)), None)
        op = py if py is not None else native
        if op is not None:
            return InCollective(stack, thread, op)
    return None


def _native_collective(frame: Frame) -> bool:
    return any(marker in frame.function for marker in _NATIVE_COLLECTIVE)


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


def _waiting_line(c: InCollective) -> str:
    site = frames.call_site(c.thread)
    called = f", called from {frames.where(site)}" if site else ""
    return f"pid {c.stack.pid} waits in {frames.where(c.op)}{called}"


def _summary(waiting: list[InCollective], elsewhere: list[ProcessStack], op: str, watchdog: bool) -> str:
    ranks = count(len(waiting), "rank") + (" waits" if len(waiting) == 1 else " wait")
    if waiting and elsewhere:
        pids = ", ".join(str(s.pid) for s in elsewhere)
        return (
            f"{ranks} in {op} for peers that never joined: pid {pids} is elsewhere, and its stack shows what "
            "it does instead."
        )
    if waiting:
        return (
            f"{ranks} in {op} and no local rank is elsewhere: the missing peer is on another machine, took "
            "a different code path earlier, or the network/NCCL transport stalled."
        )
    assert watchdog
    return "PyTorch's NCCL watchdog reported a collective that timed out: a rank never joined it."


def _remedy(elsewhere: list[ProcessStack], job: str) -> str:
    lead = (
        f"Start with pid {elsewhere[0].pid}: the rank that is not in the collective is the cause, the "
        "waiting ones are victims. "
        if elsewhere
        else ""
    )
    return (
        f"{lead}Dump every rank at the same moment (`jobwarden dump {job}`) and compare where each is; turn "
        "on PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1) and "
        "read it with `python -m torch.distributed.flight_recorder.fr_trace`; pass timeout= to "
        "init_process_group so a stuck collective fails instead of hanging."
    )

"""The verdict told as a story: when a process other than the main one failed first (rules.causal), the
finding about it leads, and what followed is listed under it as collateral, each process with what made
it a report, a reaction or a teardown.

Example: "Rank 1 (pid 4242) exited with code 3 at 12:03:07.120, first in the job's tree; then rank 0
(pid 4241) failed in turn: RuntimeError, a peer's communication error (closed by peer): collateral."
"""

from __future__ import annotations

from collections.abc import Sequence

from jobwarden.clock import shown_time
from jobwarden.model import Finding
from jobwarden.observations import Frame
from jobwarden.rules import death as exits
from jobwarden.rules import frames, naming
from jobwarden.rules.causal import (
    CAUSE,
    CRASH_SIGNALS,
    REPORT,
    TEARDOWN,
    TEARDOWN_SIGNALS,
    UNKNOWN_PID,
    WEAK,
    WRAPPERS,
    Incident,
    root_incident,
)
from jobwarden.rules.causal import incidents as find_incidents
from jobwarden.rules.evidence import RunEvidence

_SHOWN_AFTER = 6  # collateral incidents quoted under the root cause
_FAILED_STATES = frozenset({"failed", "stopped", "lost"})
_EXIT_RULES = frozenset(
    {"python-exception", "exit-code", "killed-externally", "native-crash", "terminal-hangup"}
)


def arrange(found: Sequence[Finding], ev: RunEvidence, ranked: Sequence[Finding]) -> list[Finding]:
    """`ranked` (the findings in the rule families' order) with the root cause first. When a process
    other than the main one failed first, the finding about it leads, the main process's exit finding
    (its report of that failure) is folded into the root's evidence, and the collateral is listed there.
    Only for a run that ended badly: while it runs, or after it succeeded, a child's failure is not the
    cause of anything yet."""
    if ev.state not in _FAILED_STATES:
        return list(ranked)
    timeline = find_incidents(ev)
    root = root_incident(ev, timeline)
    if root is None or root.is_main:
        return list(ranked)
    role = _role(timeline)
    lead = _finding_about(root, found, ev, role)
    if lead is None:
        return list(ranked)
    after = [i for i in timeline if i.pid != root.pid and (i.at >= root.at or i.weight < root.weight)]
    after.sort(key=lambda i: i.order)
    # the main process's end, once it followed the root: its report of it, quoted in the lead's evidence
    main_exit = _main_exit(found, ev) if any(i.is_main for i in after) else None
    lead = _with_collateral(lead, root, after, ev, role)
    rest = [
        f for f in ranked if f is not main_exit and not (f.rule == lead.rule and f.pids[:1] == lead.pids[:1])
    ]
    return [lead, *(f for f in rest if f.rule != lead.rule or f.rule not in _EXIT_RULES)]


def _finding_about(root: Incident, found: Sequence[Finding], ev: RunEvidence, role: str) -> Finding | None:
    """The most specific finding about the process that failed first: an OOM kill, a lost pool worker, a
    DataLoader worker; else how it failed (its exception, signal or exit code)."""
    pid = root.pid
    if root.relayed_by is None:
        for rule in ("oom-kill", "dataloader-worker-killed", "pool-worker-lost"):
            for f in found:
                # an OOM kill lists every victim; the worker rules name the dead worker first
                about = pid in f.pids if rule == "oom-kill" else f.pids[:1] == (pid,)
                if f.rule == rule and about:
                    return f
    subject = exits.Subject.of(pid, root.death, root.exception, role, root.rank, _name(root, ev, role))
    if root.relayed_by is not None:
        subject = subject._replace(relayed_by=_label(root.relayed_by, ev, None))
    own_lines = ev.log_tail if root.signal in CRASH_SIGNALS else ()
    return exits.process_finding(ev, subject, own_lines)


def _name(i: Incident, ev: RunEvidence, role: str) -> str | None:
    """What the process is (rules.naming): by its rank, the code it ran, its command; `role` (the main
    process's report) only where nothing of its own says. None for a process nothing names."""
    if i.pid < 0:
        return None
    frames = [*(i.exception.frames if i.exception else ()), *_stack_frames(i.pid, ev)]
    return naming.process_name(i.pid, _cmdline(i, ev), frames, role, i.rank)


def _cmdline(i: Incident, ev: RunEvidence) -> str:
    if i.death is not None and i.death.cmdline:
        return i.death.cmdline
    known = [d.cmdline for d in ev.deaths if d.pid == i.pid] + [
        p.cmdline for p in ev.processes if p.pid == i.pid
    ]
    stack = ev.last_stacks.get(i.pid)
    return next((c for c in (*known, stack.cmdline if stack else "") if c), "")


def _stack_frames(pid: int, ev: RunEvidence) -> list[Frame]:
    stack = ev.last_stacks.get(pid)
    return [f for thread in stack.threads for f in thread.frames] if stack is not None else []


def _role(timeline: Sequence[Incident]) -> str:
    """What the failed children are called: by the wrapper the main process reported them with."""
    main = next((i for i in timeline if i.is_main), None)
    if main is not None and main.wrapper in WRAPPERS:
        return WRAPPERS[main.wrapper]
    if main is not None and main.why and "DataLoader" in (main.exception.message if main.exception else ""):
        return "DataLoader worker"
    return "worker"


def _main_exit(found: Sequence[Finding], ev: RunEvidence) -> Finding | None:
    main = (ev.pid,) if ev.pid is not None else None
    return next((f for f in found if f.rule in _EXIT_RULES and f.pids == main), None)


def _with_collateral(
    lead: Finding, root: Incident, after: list[Incident], ev: RunEvidence, role: str
) -> Finding:
    who = exits.Subject.of(root.pid, root.death, root.exception, role, root.rank, _name(root, ev, role)).who
    lines = [*_last_stack(root.pid, ev), *(f"then: {_then(i, ev)}" for i in after[:_SHOWN_AFTER])]
    if len(after) > _SHOWN_AFTER:
        lines.append(f"then: {len(after) - _SHOWN_AFTER} more process(es) failed after it")
    summary = f"{who[:1].upper()}{who[1:]} {_how(root)} at {clock(root.at)}, first in the job's tree"
    if after:
        summary += f"; then {_then(after[0], ev)}: collateral"
    # a relayed exception of a process nothing names: the finding is about the process that re-raised it
    first = root.pid if root.pid != UNKNOWN_PID else root.relayed_by
    pids = (first, *lead.pids) if first is not None else lead.pids
    return lead._replace(
        summary=f"{summary}. {lead.summary}",
        evidence=(*lead.evidence, *lines),
        pids=tuple(dict.fromkeys(pids)),
        rank=root.rank,
    )


def _last_stack(pid: int, ev: RunEvidence) -> list[str]:
    """What the process was doing when a stack of it was last taken (a dump, a hang, a lost worker)."""
    stack = ev.last_stacks.get(pid)
    thread = (frames.main_thread(stack) or stack.threads[0]) if stack is not None and stack.threads else None
    if thread is None or not thread.frames:
        return []
    return [f"its last stack ({frames.thread_label(thread)}): {frames.path_of(thread.frames, 4)}"]


def _then(i: Incident, ev: RunEvidence) -> str:
    who = _label(i.pid, ev, i.rank)
    if i.weight == REPORT:
        ended = f", then was torn down by {i.signal}" if i.signal in TEARDOWN_SIGNALS else ""
        return f"{who} {i.why or 'reported it'}{ended} ({clock(i.at)})"
    if i.weight == TEARDOWN and i.signal:
        return f"{who} was torn down by {i.signal} ({clock(i.at)})"
    if i.weight == TEARDOWN and i.exception is not None:
        return f"{who} was interrupted ({exits.short_type(i.exception.type)}) ({clock(i.at)})"
    if i.weight == TEARDOWN:
        return f"{who} {_how(i)}, and its parent carried on ({clock(i.at)})"
    return f"{who} {_how(i)} ({clock(i.at)})"


def _label(pid: int, ev: RunEvidence, rank: int | None) -> str:
    if pid == ev.pid:
        return f"the main process (pid {pid})"
    if pid == UNKNOWN_PID:
        return "a worker"
    return f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"


def _how(i: Incident) -> str:
    """What the process did wrong, in a few words: its exception first (it came before its death)."""
    if i.exception is not None and i.weight in (CAUSE, REPORT):
        return f"raised {exits.short_type(i.exception.type)}"
    if i.signal:
        return f"was killed by {i.signal}"
    if i.death is not None and i.death.exit_code is not None:
        return f"exited with code {i.death.exit_code}"
    return "failed" if i.weight != WEAK else "exited"


def clock(at: float) -> str:
    """'12:03:07.120' in the zone every command shows (clock.shown_time): deaths milliseconds apart must
    read apart."""
    return shown_time(at, "ms")

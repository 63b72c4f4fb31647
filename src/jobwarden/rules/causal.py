"""The root cause across the whole tree: which failure came first, and what only followed from it.

A run's incidents are the abnormal ends of any of its processes: a death by signal or a non-zero exit,
with its wait status, its moment and, for a Python process, its uncaught exception. In time order, the
first one that is a cause is the root cause; what comes after it is collateral:
- a parent's exception that reports a child's death (torchrun's ChildFailedError, BrokenProcessPool,
  loky's TerminatedWorkerError, the DataLoader's "worker ... exited unexpectedly") is the parent's report,
  never the cause;
- ranks and workers that a launcher tears down after the first failure (SIGTERM first) are its cleanup;
- whatever ends after the main process, or after jobwarden began to end the run, was ended by jobwarden.

A moment is the kernel's (process events) or the reaping parent's where one of them told it, else when
the shim noticed, within milliseconds: every member's pidfd wakes it. Ties go to the stronger cause.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import NamedTuple

from jobwarden.model import Finding
from jobwarden.observations import ProcessDeath, UncaughtException
from jobwarden.rules import death as exits
from jobwarden.rules import frames, mltext
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.memory import oom_killed

# How much an incident explains: a cause, a launcher's teardown, or only a report of an earlier death.
CAUSE, TEARDOWN, REPORT = 2, 1, 0

_CRASH = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"})
_TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})
# A parent's exception that only reports the death of a child, and what the children are called then.
_WRAPPERS = {
    "ChildFailedError": "rank",  # torch.distributed.elastic (torchrun)
    "BrokenProcessPool": "ProcessPoolExecutor worker",
    "BrokenExecutor": "executor worker",
    "TerminatedWorkerError": "loky worker",  # joblib / loky
}
_DATALOADER_REPORT = re.compile(r"DataLoader worker \(pid")
_SHOWN_AFTER = 6  # collateral incidents quoted under the root cause
_FAILED_STATES = frozenset({"failed", "stopped", "lost"})


class Incident(NamedTuple):
    death: ProcessDeath
    weight: int  # CAUSE, TEARDOWN or REPORT
    exception: UncaughtException | None = None
    report: str | None = None  # for REPORT: the exception that reports a child's death

    @property
    def order(self) -> tuple[float, int, int]:
        """Earlier first; at the same moment the stronger cause, then a death by signal before an exit."""
        return (self.death.at, -self.weight, 0 if self.death.signal else 1)


def incidents(ev: RunEvidence) -> list[Incident]:
    """The run's abnormal ends up to the main process's own (or jobwarden's stop), in time order."""
    cutoff = _cutoff(ev)
    excs = {e.pid: e for e in ev.exceptions}
    oom = set(oom_killed(ev))
    found = [
        _incident(d, excs.get(d.pid) or _rank_exception(d, ev), d.pid in oom, ev)
        for d in (*ev.deaths, *_reported_deaths(ev))
        if d.abnormal and d.at <= cutoff
    ]
    return sorted(found, key=lambda i: i.order)


def _rank_exception(d: ProcessDeath, ev: RunEvidence) -> UncaughtException | None:
    """A rank's traceback from its `[rankN]:` lines (torch prefixes a rank's uncaught exception so), when
    the hooks recorded none (torch's own excepthook replaces theirs at init_process_group)."""
    if d.rank is None or d.exit_code in (None, 0):
        return None
    tb = mltext.rank_tracebacks(ev.log_tail).get(d.rank)
    return UncaughtException(d.pid, d.at, tb.exc_type, tb.message, tb.frames, rank=d.rank) if tb else None


def _reported_deaths(ev: RunEvidence) -> list[ProcessDeath]:
    """Ranks that torchrun's ChildFailedError report names and the shim never saw end (no kernel events,
    no hooks): the report's pid, rank and exit code, at the main process's end."""
    report = mltext.child_failed(ev.log_tail)
    main = next((d for d in ev.deaths if d.is_main), None)
    if report is None or main is None:
        return []
    seen = {d.pid for d in ev.deaths}
    return [
        ProcessDeath(
            f.pid,
            main.pid,
            f"rank {f.rank} of {report.name or 'the job'} (from torchrun's report)",
            main.at,
            None if f.signal else f.exitcode,
            f.signal,
            rank=f.rank,
        )
        for f in (report.root_cause, *report.other_failures)
        if f.pid not in seen
    ]


def root_incident(ev: RunEvidence, found: Sequence[Incident] | None = None) -> Incident | None:
    """The first cause; when the main process only reported a death, the first teardown stands in for the
    death nobody saw. None when the run has no incident (still running, hung, succeeded)."""
    found = incidents(ev) if found is None else found
    cause = next((i for i in found if i.weight == CAUSE), None)
    if cause is not None:
        return cause
    main = next((i for i in found if i.death.is_main), None)
    if main is not None and main.weight == REPORT:
        return next((i for i in found if not i.death.is_main), None)
    return None


def _cutoff(ev: RunEvidence) -> float:
    ends = [d.at for d in ev.deaths if d.is_main]
    if ev.stopping_at is not None:
        ends.append(ev.stopping_at)
    return min(ends, default=float("inf"))


def _incident(d: ProcessDeath, exc: UncaughtException | None, oom: bool, ev: RunEvidence) -> Incident:
    if oom or d.signal in _CRASH or d.signal == "SIGKILL":
        return Incident(d, CAUSE, exc)
    if d.signal is not None:  # SIGTERM & co: a launcher's teardown, unless it hit the main process
        return Incident(d, CAUSE if d.is_main else TEARDOWN, exc)
    report = _report_of(exc, ev.log_tail if d.is_main else ())
    if report is not None:
        return Incident(d, REPORT, exc, report)
    if d.is_main and exc is None and exits.parse_traceback(ev.log_tail) is None:
        return Incident(d, TEARDOWN, exc)  # a bare exit code: a shell script passing a failure on
    if not d.is_main and exc is None:
        # A child's bare exit code is an answer its parent may well have taken (`readlink` in a shell
        # script, `grep` finding nothing): it leads only when nothing stronger failed, as a teardown does.
        return Incident(d, TEARDOWN, exc)
    return Incident(d, CAUSE, exc)


def _report_of(exc: UncaughtException | None, lines: Sequence[str]) -> str | None:
    """The wrapper exception's name when the process ended by reporting a child's death."""
    if exc is not None:
        chain = list(zip(exc.types, (exc.message, *(m for _, m in exc.chain)), strict=True))
    else:
        parsed = exits.parse_traceback(lines)
        chain = [(parsed[0], parsed[1])] if parsed else []
    for qualified, message in chain:
        name = qualified.rpartition(".")[2]
        if name in _WRAPPERS or _DATALOADER_REPORT.search(message):
            return name
    return None


# --- arranging the findings -------------------------------------------------------------------------


def arrange(found: Sequence[Finding], ev: RunEvidence, ranked: Sequence[Finding]) -> list[Finding]:
    """`ranked` (the findings in the rule families' order) with the root cause first. When a process
    other than the main one failed first, the finding about it leads, the main process's exit finding
    (its report of that death) is folded into the root's evidence, and the collateral is listed there.
    Only for a run that ended badly: while it runs, or after it succeeded, a child's death is not the
    cause of anything yet."""
    if ev.state not in _FAILED_STATES:
        return list(ranked)
    timeline = incidents(ev)
    root = root_incident(ev, timeline)
    if root is None or root.death.is_main:
        return list(ranked)
    role = _role(timeline)
    lead = _finding_about(root, found, ev, role)
    if lead is None:
        return list(ranked)
    after = [i for i in timeline if i.death.pid != root.death.pid and i.death.at >= root.death.at]
    # the main process's end, once it followed the root: its report of it, quoted in the lead's evidence
    main_exit = _main_exit(found, ev) if any(i.death.is_main for i in after) else None
    lead = _with_collateral(lead, root, after, ev, role)
    return [lead, *(f for f in ranked if f.rule != lead.rule and f is not main_exit)]


def _finding_about(root: Incident, found: Sequence[Finding], ev: RunEvidence, role: str) -> Finding | None:
    """The most specific finding about the process that failed first: an OOM kill, a lost pool worker, a
    DataLoader worker; else how it ended (its exception, signal or exit code)."""
    pid = root.death.pid
    for rule in ("oom-kill", "dataloader-worker-killed", "pool-worker-lost"):
        for f in found:
            # an OOM kill lists every victim; the worker rules name the dead worker first
            about = pid in f.pids if rule == "oom-kill" else f.pids[:1] == (pid,)
            if f.rule == rule and about:
                return f
    subject = exits.Subject.of(root.death, root.exception, role)
    own_lines = ev.log_tail if root.death.signal in _CRASH else ()
    return exits.process_finding(ev, subject, own_lines)


def _role(timeline: Sequence[Incident]) -> str:
    """What the failed children are called: by the wrapper the main process reported them with."""
    main = next((i for i in timeline if i.death.is_main), None)
    if main is not None and main.report is not None:
        return _WRAPPERS.get(main.report, "DataLoader worker")
    return "worker"


def _main_exit(found: Sequence[Finding], ev: RunEvidence) -> Finding | None:
    exit_rules = {"python-exception", "exit-code", "killed-externally", "native-crash", "terminal-hangup"}
    main = (ev.pid,) if ev.pid is not None else None
    return next((f for f in found if f.rule in exit_rules and f.pids == main), None)


def _with_collateral(
    lead: Finding, root: Incident, after: list[Incident], ev: RunEvidence, role: str
) -> Finding:
    who = exits.Subject.of(root.death, root.exception, role).who
    how = _how(root.death)
    lines = [*_last_stack(root.death.pid, ev), *(f"then: {_then(i)}" for i in after[:_SHOWN_AFTER])]
    if len(after) > _SHOWN_AFTER:
        lines.append(f"then: {len(after) - _SHOWN_AFTER} more process(es) ended after it")
    summary = f"{who[:1].upper()}{who[1:]} {how} at {clock(root.death.at)}, first in the job's tree"
    if after:
        summary += f"; then {_then(after[0])}: collateral"
    return lead._replace(
        summary=f"{summary}. {lead.summary}",
        evidence=(*lead.evidence, *lines),
        pids=tuple(dict.fromkeys((root.death.pid, *lead.pids))),
        rank=root.death.rank,
    )


def _last_stack(pid: int, ev: RunEvidence) -> list[str]:
    """What the process was doing when a stack of it was last taken (a dump, a hang, a lost worker)."""
    stack = ev.last_stacks.get(pid)
    thread = (frames.main_thread(stack) or stack.threads[0]) if stack is not None and stack.threads else None
    if thread is None or not thread.frames:
        return []
    return [f"its last stack ({frames.thread_label(thread)}): {frames.path_of(thread.frames, 4)}"]


def _then(i: Incident) -> str:
    d = i.death
    who = f"the main process (pid {d.pid})" if d.is_main else _label(d)
    if i.weight == REPORT:
        return f"{who} raised {i.report} reporting it ({clock(d.at)})"
    if i.weight == TEARDOWN and not d.is_main:
        return f"{who} was torn down by {d.signal} ({clock(d.at)})"
    return f"{who} {_how(d)} ({clock(d.at)})"


def _label(d: ProcessDeath) -> str:
    return f"rank {d.rank} (pid {d.pid})" if d.rank is not None else f"pid {d.pid}"


def _how(d: ProcessDeath) -> str:
    return f"was killed by {d.signal}" if d.signal else f"exited with code {d.exit_code}"


def clock(at: float) -> str:
    """'12:03:07.120', local time: deaths milliseconds apart must read apart."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"

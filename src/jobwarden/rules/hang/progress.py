"""`no-progress`: the watchdog judged the run hung and no known signature explains it.

It says what was quiet and for how long, where the main thread is, what the stacks hint at (threads waiting
on locks: a lock-order deadlock; a thread holding the GIL in native code: the rest of Python starves), and
the last output lines: the reader's starting points.
"""

from __future__ import annotations

from jobwarden.config import format_duration
from jobwarden.model import Finding
from jobwarden.observations import ProcessStack
from jobwarden.rules import frames
from jobwarden.rules.evidence import RunEvidence, job_ref
from jobwarden.rules.hang.locks import lock_wait
from jobwarden.rules.lookup import Lookup, describe

_SIGNS = "output, heartbeat, CPU, I/O or GPU work"


def no_progress(ev: RunEvidence) -> Finding | None:
    if ev.hang_window_s is None:
        return None
    look = Lookup.of(ev)
    quiet = format_duration(ev.quiet_for_s if ev.quiet_for_s is not None else ev.hang_window_s)
    window = format_duration(ev.hang_window_s)
    main = _main_stack(ev, look)
    hints = [line for stack in look.live_stacks() for line in _hints(stack, look)]
    evidence = [_quiet_line(ev, quiet, window)]
    if ev.step_note:
        evidence.insert(0, ev.step_note)
    if main is not None:
        evidence.append(_main_line(main, look))
    elif ev.pid is not None:
        evidence.append(f"no stack of the main process {ev.pid} was captured")
    evidence += hints[:6]
    evidence += [f"output: {line}" for line in [x for x in ev.log_tail if x.strip()][-3:]] or [
        "the job wrote no output"
    ]
    deadlock = sum("waits on a lock" in h for h in hints) >= 2
    summary = f"No {_SIGNS} for {quiet} (the hang window is {window}), and no known hang signature matched"
    if ev.last_progress == "step":
        summary = (
            f"The step counter has not moved for {quiet} (the hang window is {window}) although the job "
            "may still burn CPU (a spin, a busy-waiting collective), and no known hang signature matched"
        )
    summary += "; two or more threads wait on locks, a lock-order deadlock." if deadlock else "."
    return Finding(
        "no-progress",
        f"No progress for {quiet}",
        summary,
        "warning",
        tuple(evidence),
        _remedy(deadlock, job_ref(ev)),
        tuple(s.pid for s in look.live_stacks()) or ((ev.pid,) if ev.pid else ()),
    )


def _main_stack(ev: RunEvidence, look: Lookup) -> ProcessStack | None:
    if ev.pid is not None and ev.pid in look.stacks:
        return look.stacks[ev.pid]
    main = next((p.pid for p in ev.processes if p.is_main), None)
    return look.stacks.get(main) if main is not None else None


def _quiet_line(ev: RunEvidence, quiet: str, window: str) -> str:
    if ev.last_progress == "step":  # a running step counter is the only sign that counted
        return f"no new step for {quiet} (window {window}); CPU, I/O and output do not count while one runs"
    last = f"; the last sign of progress was {ev.last_progress}" if ev.last_progress else ""
    return f"quiet for {quiet} (window {window}): no {_SIGNS}{last}"


def _main_line(stack: ProcessStack, look: Lookup) -> str:
    thread = frames.main_thread(stack)
    if thread is None or not thread.frames:
        why = f": {stack.error}" if stack.error else ""
        return f"no stack for the main process {stack.pid}{why}"
    who = describe(stack.pid, look.cmdline(stack.pid), 50)
    return f"main thread of {who}: {frames.path_of(thread.frames)}"


def _hints(stack: ProcessStack, look: Lookup) -> list[str]:
    facts = look.processes.get(stack.pid)
    lines = []
    for thread in stack.threads:
        wait = lock_wait(thread, facts, len(stack.threads))
        if wait is not None:
            at = frames.where(wait.at) if wait.at else "native code"
            who = f"pid {stack.pid} {frames.thread_label(thread)}"
            lines.append(f"{who} waits on a lock at {at} ({wait.how})")
        if thread.owns_gil and not thread.active and thread.frames and thread.frames[0].native:
            lines.append(
                f"pid {stack.pid} {frames.thread_label(thread)} holds the GIL inside native code "
                f"({frames.where(thread.frames[0])}): no other Python thread of the process can run"
            )
    return lines


def _remedy(deadlock: bool, job: str) -> str:
    if deadlock:
        return (
            "Read the lock waits above: each thread holds one lock and wants another's. Take locks in one "
            "global order, hold them for less, or acquire with a timeout; restart the job to get it moving."
        )
    return (
        f"Start from the main thread's innermost frame above: that is where it waits. `jobwarden dump {job}` "
        "takes fresh stacks of every process. If the job is legitimately silent this long (a large "
        "checkpoint, preprocessing), call jobwarden.heartbeat() in that phase or raise --hang-timeout."
    )

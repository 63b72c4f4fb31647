"""Why a run ended: findings from its exit status, how it was ended, and the tail of its output.

One root cause among the exit-status rules (`exit_finding`), then what happened around the end
(`aftermath_findings`: orphans-left, supervisor-lost). Rule ids are stable (DESIGN.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jobwarden.model import Finding
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.memory import oom_killed

_CRASH_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"}
_KILL_SIGNALS = {"SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT"}
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
# "ValueError: bad", "pkg.errors.ConfigError: x", or a bare "AssertionError" (no message, no colon)
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: ?(?P<msg>.*))?$")


def explain(ev: RunEvidence) -> list[Finding]:
    """The death rules alone: the exit's root cause, then the aftermath. `rules.explain` runs every family."""
    found = exit_finding(ev)
    return ([found] if found else []) + aftermath_findings(ev)


def exit_finding(ev: RunEvidence) -> Finding | None:
    """The one root cause the exit status gives; None for a clean or still running run, and for a SIGKILL
    the OOM evidence explains (the oom-kill finding says it)."""
    if ev.end_reason in ("hung", "mem-limit", "supervisor-failed"):
        # jobwarden ended it, or never started it: the hang, oom-kill or supervisor-lost finding says why
        return None
    for rule in (_spawn_failed, _stopped, _timeout, _python_exception, _signal_death, _exit_code):
        found = rule(ev)
        if found:
            return found
    return None


def aftermath_findings(ev: RunEvidence) -> list[Finding]:
    return [f for f in (_orphans_left(ev), _supervisor_lost(ev)) if f]


def _pids(ev: RunEvidence) -> tuple[int, ...]:
    return (ev.pid,) if ev.pid else ()


def _tail_evidence(ev: RunEvidence, n: int = 5) -> tuple[str, ...]:
    lines = [line for line in ev.log_tail if line.strip()][-n:]
    return tuple(f"output: {line}" for line in lines) or ("the job wrote no output",)


def _spawn_failed(ev: RunEvidence) -> Finding | None:
    if ev.end_reason != "spawn-failed":
        return None
    return Finding(
        "exit-code",
        "The command could not be started",
        ev.error or "exec failed",
        "error",
        (f"exit code {ev.exit_code}",),
        "check the command path, its execute bit and --cwd",
    )


def _stopped(ev: RunEvidence) -> Finding | None:
    if ev.end_reason != "stopped":
        return None
    how = f"signal {ev.signal}" if ev.signal else f"exit code {ev.exit_code}"
    return Finding(
        "stopped-by-user",
        "Stopped by `jobwarden stop`",
        f"The job was stopped on request; its main process ended with {how}.",
        "info",
        (f"main process {ev.pid}: {how}",),
        "nothing to fix; `jobwarden run` it again to resume",
        _pids(ev),
    )


def _timeout(ev: RunEvidence) -> Finding | None:
    if ev.end_reason != "timeout":
        return None
    limit = f" of {ev.timeout_s:g}s" if ev.timeout_s else ""
    return Finding(
        "timeout",
        f"Ended by the --timeout{limit}",
        "The job was still running when its time limit passed, so jobwarden stopped it.",
        "error",
        (f"--timeout{limit}", *_tail_evidence(ev, 3)),
        "raise --timeout if the job needs longer, or look at `jobwarden logs` for where it slowed",
        _pids(ev),
    )


def parse_traceback(lines: Sequence[str]) -> tuple[str, str, str | None] | None:
    """The last Python traceback in `lines`: (type, message, innermost 'file:line in func')."""
    start = max((i for i, line in enumerate(lines) if line.strip() == _TRACEBACK), default=-1)
    if start < 0:
        return None
    frame = None
    for line in lines[start + 1 :]:
        m = _FRAME.match(line)
        if m:
            frame = f"{m['file']}:{m['line']} in {m['func']}"
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        e = _EXCEPTION.match(line.strip())
        if e:
            return e["type"], e["msg"] or "", frame
    return None


_FAULT_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')


def parse_fatal_error(lines: Sequence[str]) -> tuple[str, list[str]] | None:
    """faulthandler's report of a fatal signal in `lines`: ('Segmentation fault', frames of the current
    thread innermost first as 'func (file:line)'), or None."""
    start = max((i for i, line in enumerate(lines) if line.startswith("Fatal Python error: ")), default=-1)
    if start < 0:
        return None
    message = lines[start][len("Fatal Python error: ") :].strip()
    frames: list[str] = []
    in_current = False
    for line in lines[start + 1 :]:
        if line.startswith(("Current thread", "Thread 0x")):
            if frames:
                break  # the crashing thread comes first; other threads follow
            in_current = line.startswith("Current thread")
            continue
        m = _FAULT_FRAME.match(line)
        if m and in_current:
            frames.append(f"{m['func']} ({m['file']}:{m['line']})")
    return message, frames


def _python_exception(ev: RunEvidence) -> Finding | None:
    if ev.exit_code in (None, 0) or ev.signal:
        return None
    parsed = parse_traceback(ev.log_tail)
    if parsed is None:
        return None
    exc_type, message, frame = parsed
    evidence = [f"{exc_type}: {message}"] + ([f"raised at {frame}"] if frame else [])
    return Finding(
        "python-exception",
        f"Uncaught {exc_type}",
        f"{exc_type}: {message}",
        "error",
        (*tuple(evidence), f"exit code {ev.exit_code}"),
        f"fix the error at {frame or 'the innermost frame'}; `jobwarden logs` shows the traceback",
        _pids(ev),
    )


def _signal_death(ev: RunEvidence) -> Finding | None:
    sig = ev.signal
    if not sig:
        return None
    pid_note = (f"main process {ev.pid} killed by {sig}",)
    if sig == "SIGHUP":
        return Finding(
            "terminal-hangup",
            "Killed by SIGHUP (a terminal closed)",
            "The process received SIGHUP, which is sent when the terminal or SSH session it is "
            "attached to closes.",
            "error",
            pid_note,
            "start it with `jobwarden run` (detached, no terminal) instead of nohup or a shell",
            _pids(ev),
        )
    if sig == "SIGPIPE":
        return Finding(
            "broken-pipe",
            "Killed by SIGPIPE (wrote to a closed pipe)",
            "The process wrote to a pipe or socket whose reader had gone.",
            "error",
            pid_note + _tail_evidence(ev, 3),
            "find the reader that exited first (a `| head`, a dead log collector) and keep it alive",
            _pids(ev),
        )
    if sig in _CRASH_SIGNALS:
        fatal = parse_fatal_error(ev.log_tail)
        if fatal:
            message, frames = fatal
            where = f" in {frames[0]}" if frames else ""
            trace = (f"faulthandler: {message}", *(f"  at {f}" for f in frames[:8]))
            remedy = (
                f"the crash happened during the call at {frames[0]}: update or rebuild the extension it "
                "calls into, or check the arguments passed to it (ctypes, a C array index)"
                if frames
                else "update or rebuild the native library named in the trace"
            )
        else:
            where, trace = "", _tail_evidence(ev)
            remedy = (
                "look for 'Fatal Python error' in `jobwarden logs`; update or rebuild the native "
                "library named in the trace"
            )
        return Finding(
            "native-crash",
            f"Crashed with {sig}{where}",
            f"The process died of {sig}, a crash in native code (an extension, driver or "
            "the interpreter), not a Python exception.",
            "critical",
            pid_note + trace,
            remedy,
            _pids(ev),
        )
    if sig == "SIGKILL" and ev.pid in oom_killed(ev):
        return None  # the OOM killer (or jobwarden's memory watchdog) sent it: that is the oom-kill finding
    if sig in _KILL_SIGNALS:
        return Finding(
            "killed-externally",
            f"Killed by {sig} from outside jobwarden",
            f"Something other than jobwarden sent {sig}: a user, a scheduler, or the kernel "
            "OOM killer (no OOM evidence was collected for this run).",
            "error",
            pid_note + _tail_evidence(ev, 3),
            "check who sent it (`last`, scheduler logs, `dmesg | grep -i oom`); run with "
            "--mem-limit to make memory kills explicit",
            _pids(ev),
        )
    return Finding(
        "exit-code",
        f"Killed by {sig}",
        f"The main process died of {sig}.",
        "error",
        pid_note + _tail_evidence(ev, 3),
        "find out what sends this signal",
        _pids(ev),
    )


def _exit_code(ev: RunEvidence) -> Finding | None:
    if ev.exit_code in (None, 0):
        return None
    return Finding(
        "exit-code",
        f"Exited with code {ev.exit_code}",
        f"The main process exited with status {ev.exit_code} and gave no clearer sign why.",
        "error",
        (f"exit code {ev.exit_code}", *_tail_evidence(ev)),
        "read the last lines of the output (`jobwarden logs -n 50`)",
        _pids(ev),
    )


def _orphans_left(ev: RunEvidence) -> Finding | None:
    if not ev.orphans_left:
        return None
    listed = tuple(f"pid {o['pid']}: {o['cmdline']}" for o in ev.orphans_left[:10])
    cleaned = "could not all be ended" if ev.survivors else "were ended by jobwarden"
    return Finding(
        "orphans-left",
        f"{len(ev.orphans_left)} descendant(s) outlived the main process",
        f"When the main process ended, {len(ev.orphans_left)} of its descendants were still "
        f"running; they {cleaned}.",
        "warning",
        listed,
        "join or terminate worker processes before exiting (Pool.close()/join(), "
        "DataLoader shutdown, `wait` in shell scripts)",
        tuple(int(o["pid"]) for o in ev.orphans_left),
    )


def _supervisor_lost(ev: RunEvidence) -> Finding | None:
    if ev.end_reason == "supervisor-failed":
        return Finding(
            "supervisor-lost",
            "The supervisor (shim) died before it started the job",
            ev.error or "jobwarden's per-job supervisor ended before it started the command.",
            "error",
            ("no process was started: the run has no pid and no exit code",),
            "a fault in jobwarden: its error was printed by `run` or is in the run's shim.log; "
            "please report it, then run the job again",
        )
    if ev.state != "lost" and "supervisor-lost" not in ev.events:
        return None
    return Finding(
        "supervisor-lost",
        "The supervisor (shim) died",
        "jobwarden's per-job supervisor was killed; the job ran on unsupervised, so its end "
        "may not have been recorded.",
        "warning",
        ("event: supervisor-lost",),
        "`jobwarden adopt JOB` starts a new supervisor for the surviving processes",
        _pids(ev),
    )

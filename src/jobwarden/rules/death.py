"""Why a run ended: findings from its exit status, how it was ended, and the tail of its output.

One root cause among the exit-status rules (`exit_finding`), then what happened around the end
(`aftermath_findings`: disk-full, orphans-left, supervisor-lost). Rule ids are stable (docs/rules.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from jobwarden.config import counted
from jobwarden.model import Finding
from jobwarden.observations import Frame, ProcessDeath, UncaughtException
from jobwarden.rules import mltext
from jobwarden.rules.causal import TEARDOWN_SIGNALS
from jobwarden.rules.disk import disk_full
from jobwarden.rules.engine import engine_stop
from jobwarden.rules.evidence import RunEvidence, job_ref
from jobwarden.rules.exceptions import exception_remedy
from jobwarden.rules.frames import is_library, short_file
from jobwarden.rules.gpuerrors import gpu_context
from jobwarden.rules.memory import oom_killed

_CRASH_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"}
_KILL_SIGNALS = {"SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT"}


def explain(ev: RunEvidence) -> list[Finding]:
    """The death rules alone: the exit's root cause, then the aftermath. `rules.explain` runs every family."""
    found = exit_finding(ev)
    return ([found] if found else []) + aftermath_findings(ev)


class Subject(NamedTuple):
    """The process an exit-status finding is about: the main process, or any process of the tree that
    died first (a rank, a pool worker)."""

    pid: int | None
    who: str  # "main process 4242", "rank 1 (pid 4242)", "Pool worker pid 811", "process pid 9 (sort)"
    exit_code: int | None
    signal: str | None
    rank: int | None = None
    exception: UncaughtException | None = None  # its uncaught exception, as the Python hooks recorded it
    is_main: bool = False
    relayed_by: str | None = None  # its exception reached the job's end through this process's re-raise

    @classmethod
    def main(cls, ev: RunEvidence) -> Subject:
        exc = next((e for e in ev.exceptions if e.pid == ev.pid), None)
        return cls(ev.pid, f"main process {ev.pid}", ev.exit_code, ev.signal, _main_rank(ev), exc, True)

    @classmethod
    def of(
        cls,
        pid: int,
        death: ProcessDeath | None,
        exc: UncaughtException | None,
        role: str = "process",
        rank: int | None = None,
        name: str | None = None,
    ) -> Subject:
        """A process of the tree: how it ended (`death`, None when it did not fail itself: a worker that
        caught its task's exception and passed it on) and the exception it raised. `name`: what it is
        (rules.naming), else `role` names it."""
        who = name or (
            f"rank {rank} (pid {pid})"
            if rank is not None
            else f"{role} pid {pid}"
            if pid >= 0
            else f"a {role}"
        )
        if death is None:
            return cls(pid if pid >= 0 else None, who, None, None, rank, exc)
        return cls(pid, who, death.exit_code, death.signal, rank, exc)

    @property
    def pids(self) -> tuple[int, ...]:
        return (self.pid,) if self.pid else ()


def _with_gpu_context(found: Finding, lines: Sequence[str]) -> Finding:
    """A RuntimeError that is really a device-side assert, a SIGABRT that is NCCL's watchdog: the GPU
    stack's own text goes into the evidence, and its remedy first."""
    gpu = gpu_context(lines)
    if not gpu.evidence:
        return found
    if gpu.cause and found.rule == "native-crash":  # the library aborted on purpose: its text says why
        return found._replace(
            title=f"{found.title}: {gpu.cause}", evidence=(*found.evidence, *gpu.evidence), remedy=gpu.remedy
        )
    return found._replace(evidence=(*found.evidence, *gpu.evidence), remedy=f"{gpu.remedy} {found.remedy}")


def _main_rank(ev: RunEvidence) -> int | None:
    main = next((d for d in ev.deaths if d.is_main), None)
    return main.rank if main else None


def exit_finding(ev: RunEvidence) -> Finding | None:
    """The one root cause the exit status gives; None for a clean or still running run, and for a SIGKILL
    the OOM evidence explains (the oom-kill finding says it)."""
    if ev.end_reason in ("hung", "mem-limit", "supervisor-failed"):
        # jobwarden ended it, or never started it: the hang, oom-kill or supervisor-lost finding says why
        return None
    for rule in (_spawn_failed, engine_stop, _stopped, _timeout):
        found = rule(ev)
        if found:
            return found
    return process_finding(ev, Subject.main(ev), ev.log_tail)


def process_finding(ev: RunEvidence, who: Subject, log_tail: Sequence[str]) -> Finding | None:
    """How one process ended, as a finding about it: its uncaught exception, the signal that killed it, or
    its exit code. `log_tail` is the output known to be its own (the whole log for the main process, the
    `[rankN]:` lines for a rank)."""
    for rule in (_python_exception, _signal_death, _exit_code):
        found = rule(ev, who, log_tail)
        if found:
            found = _with_gpu_context(found, log_tail)
            if not who.is_main:  # "Rank 1 (pid 4242): killed by SIGKILL from outside jobwarden"
                found = found._replace(title=f"{_cap(who.who)}: {found.title[:1].lower()}{found.title[1:]}")
            return found._replace(rank=who.rank)
    return None


def aftermath_findings(ev: RunEvidence, disk: Finding | None = None) -> list[Finding]:
    """What happened around the end; `disk`: the disk-full finding as the root cause (rules.disk), in
    place of the warning."""
    return [f for f in (disk or disk_full(ev), _orphans_left(ev), _supervisor_lost(ev)) if f]


def _pids(ev: RunEvidence) -> tuple[int, ...]:
    return (ev.pid,) if ev.pid else ()


def _tail_evidence(lines: Sequence[str], n: int = 5, whole_log: bool = True) -> tuple[str, ...]:
    """The last lines of output; for a process whose own lines cannot be told apart (a worker writing
    into the job's shared log), nothing rather than a claim that the job wrote none."""
    lines = [line for line in lines if line.strip()][-n:]
    silent = ("the job wrote no output",) if whole_log else ()
    return tuple(f"output: {line}" for line in lines) or silent


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
    ended = f"its main process ended with {how}" if ev.pid else "before this run's process was started"
    return Finding(
        "stopped-by-user",
        "Stopped by `jobwarden stop`",
        f"The job was stopped on request; {ended}.",
        "info",
        (f"main process {ev.pid}: {how}",) if ev.pid else ("no process of this run was started",),
        f"nothing to fix; `jobwarden rerun {job_ref(ev)}` starts it again from the start (a rerun does not "
        "resume: the job's own checkpoints do)",
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
        (f"--timeout{limit}", *_tail_evidence(ev.log_tail, 3)),
        "raise --timeout if the job needs longer, or look at `jobwarden logs` for where it slowed",
        _pids(ev),
    )


def parse_traceback(lines: Sequence[str]) -> tuple[str, str, str | None] | None:
    """The last Python traceback in `lines`: (type, message, where it was raised, as `raised_at` says)."""
    parsed = mltext.parse_traceback(lines)
    return (parsed.exc_type, parsed.message, raised_at(parsed.frames)) if parsed else None


def raised_at(frames: Sequence[Frame]) -> str | None:
    """'file:line in func' of the innermost frame of the user's own code, with the library frame below it
    as context; None without frames."""
    if not frames:
        return None
    own = next((f for f in frames if not is_library(f)), None)
    if own is None or own is frames[0]:
        return _at(own or frames[0])
    return f"{_at(own)}, inside {short_file(frames[0].file)}:{frames[0].line} in {frames[0].function}"


def _at(frame: Frame) -> str:
    return f"{frame.file}:{frame.line} in {frame.function}"


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


def _python_exception(ev: RunEvidence, who: Subject, lines: Sequence[str]) -> Finding | None:
    # A process whose uncaught exception the hooks recorded, and which then aborted, aborted while it shut
    # down (torch's process group torn down from a destructor): the exception is what went wrong.
    aborted_after = who.signal == "SIGABRT" and who.exception is not None
    relayed = who.relayed_by is not None and who.exception is not None
    # a worker torn down by its launcher while it exited of its exception (causal._torn_down) died of it
    torn_down = who.signal in TEARDOWN_SIGNALS and who.exception is not None and not who.is_main
    if (who.exit_code in (None, 0) or who.signal) and not (aborted_after or relayed or torn_down):
        return None
    raised = _raised(who, lines)
    if raised is None:
        return None
    exc_type, message, frame = raised
    hangup = _agent_signal(exc_type, message)
    if hangup is not None and not relayed:  # the launcher turned a signal into an exception: name the signal
        return _signal_death(ev, who._replace(signal=hangup, exit_code=None), lines)
    evidence = [f"{exc_type}: {message}"] + ([f"raised at {frame}"] if frame else [])
    if relayed:
        evidence.append(f"re-raised by {who.relayed_by}")
    evidence.append(_after_it(who, aborted_after))
    return Finding(
        "python-exception",
        f"Uncaught {exc_type}",
        f"{exc_type}: {message}",
        "error",
        tuple(evidence),
        exception_remedy(exc_type, message, frame, who.exception.executable if who.exception else None),
        who.pids,
    )


def _after_it(who: Subject, aborted_after: bool) -> str:
    """What became of the process after it raised."""
    if aborted_after:
        return "then it aborted (SIGABRT) while shutting down"
    if who.signal in TEARDOWN_SIGNALS and not who.is_main:
        return f"then, on its way out, it was torn down by {who.signal}"
    if who.signal:
        return f"then it was killed by {who.signal}"
    if who.exit_code not in (None, 0):
        return f"exit code {who.exit_code}"
    return "it passed the exception on and did not fail itself"


def _raised(who: Subject, lines: Sequence[str]) -> tuple[str, str, str | None] | None:
    """(type, message, 'file:line in func' of the user's own innermost frame): from the hooks' record of
    the process's uncaught exception, else from the last traceback in its output."""
    exc = who.exception
    if exc is not None:
        return short_type(exc.type), exc.message, raised_at(exc.frames)
    return parse_traceback(lines)


def short_type(qualified: str) -> str:
    """'concurrent.futures.process.BrokenProcessPool' -> 'BrokenProcessPool': the name a reader knows."""
    return qualified.rpartition(".")[2]


def _agent_signal(exc_type: str, message: str) -> str | None:
    """torch.distributed.elastic's agent handles SIGHUP/SIGTERM itself and raises SignalException
    ("Process 42 got signal: 1"): it died of that signal, whatever its exit code says."""
    caught = mltext.signal_exception([f"{exc_type}: {message}"])
    return caught.signal if caught is not None and caught.signal.startswith("SIG") else None


def _signal_death(ev: RunEvidence, who: Subject, lines: Sequence[str]) -> Finding | None:
    sig = who.signal
    if not sig:
        return None
    pid_note = (f"{who.who} killed by {sig}",)
    if sig == "SIGHUP":
        return Finding(
            "terminal-hangup",
            "Killed by SIGHUP (a terminal closed)",
            f"{_cap(who.who)} received SIGHUP, which is sent when the terminal or SSH session it is "
            "attached to closes.",
            "error",
            pid_note,
            "start it with `jobwarden run` (detached, no terminal) instead of nohup or a shell; a program "
            "that installs its own SIGHUP handler (torchrun does) dies of a closing terminal even under "
            "nohup",
            who.pids,
        )
    if sig == "SIGPIPE":
        return Finding(
            "broken-pipe",
            "Killed by SIGPIPE (wrote to a closed pipe)",
            f"{_cap(who.who)} wrote to a pipe or socket whose reader had gone.",
            "error",
            pid_note + _tail_evidence(lines, 3, who.is_main),
            "find the reader that exited first (a `| head`, a dead log collector) and keep it alive",
            who.pids,
        )
    if sig in _CRASH_SIGNALS:
        return _native_crash(who, sig, lines, pid_note)
    if sig == "SIGKILL" and who.pid in oom_killed(ev):
        return None  # the OOM killer (or jobwarden's memory watchdog) sent it: that is the oom-kill finding
    if sig in _KILL_SIGNALS:
        return Finding(
            "killed-externally",
            f"Killed by {sig} from outside jobwarden",
            f"Something other than jobwarden sent {sig} to {who.who}: a user, a scheduler, or the kernel "
            "OOM killer (no OOM evidence was collected for this run).",
            "error",
            pid_note + _tail_evidence(lines, 3, who.is_main),
            _who_sent_it(ev),
            who.pids,
        )
    return Finding(
        "exit-code",
        f"Killed by {sig}",
        f"{_cap(who.who)} died of {sig}.",
        "error",
        pid_note + _tail_evidence(lines, 3, who.is_main),
        "find out what sends this signal",
        who.pids,
    )


def _native_crash(who: Subject, sig: str, lines: Sequence[str], pid_note: tuple[str, ...]) -> Finding:
    fatal = parse_fatal_error(lines)
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
        where, trace = "", _tail_evidence(lines, whole_log=who.is_main)
        remedy = (
            "look for 'Fatal Python error' in `jobwarden logs`; update or rebuild the native "
            "library named in the trace"
        )
    return Finding(
        "native-crash",
        f"Crashed with {sig}{where}",
        f"{_cap(who.who)} died of {sig}, a crash in native code (an extension, driver or "
        "the interpreter), not a Python exception.",
        "critical",
        pid_note + trace,
        remedy,
        who.pids,
    )


def _exit_code(ev: RunEvidence, who: Subject, lines: Sequence[str]) -> Finding | None:
    if who.exit_code in (None, 0):
        return None
    return Finding(
        "exit-code",
        f"Exited with code {who.exit_code}",
        f"{_cap(who.who)} exited with status {who.exit_code} and gave no clearer sign why.",
        "error",
        (f"exit code {who.exit_code}", *_tail_evidence(lines, whole_log=who.is_main)),
        "read the last lines of the output (`jobwarden logs -n 50`)",
        who.pids,
    )


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _orphans_left(ev: RunEvidence) -> Finding | None:
    if not ev.orphans_left:
        return None
    listed = tuple(f"pid {o['pid']}: {o['cmdline']}" for o in ev.orphans_left[:10])
    cleaned = _cleaned(len(ev.orphans_left), bool(ev.survivors))
    return Finding(
        "orphans-left",
        f"{counted(len(ev.orphans_left), 'descendant')} outlived the main process",
        f"When the main process ended, {_were_still_running(len(ev.orphans_left))}; {cleaned}.",
        "warning",
        listed,
        "join or terminate worker processes before exiting (Pool.close()/join(), "
        "DataLoader shutdown, `wait` in shell scripts)",
        tuple(int(o["pid"]) for o in ev.orphans_left),
    )


def _cleaned(n: int, survived: bool) -> str:
    if survived:
        return "it could not be ended" if n == 1 else "they could not all be ended"
    return "jobwarden ended it" if n == 1 else "jobwarden ended them"


def _were_still_running(n: int) -> str:
    """'1 of its descendants was still running', '3 of its descendants were still running'."""
    return f"{n} of its descendants {'was' if n == 1 else 'were'} still running"


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
    if _lost_between_runs(ev.events):
        return _lost_in_backoff(ev)
    return Finding(
        "supervisor-lost",
        "The supervisor (shim) died",
        "jobwarden's per-job supervisor was killed; the job ran on unsupervised, so its end "
        "may not have been recorded.",
        "warning",
        ("event: supervisor-lost",),
        f"`jobwarden adopt {job_ref(ev)}` starts a new supervisor for the surviving processes",
        _pids(ev),
    )


def _lost_between_runs(events: Sequence[str]) -> bool:
    """The supervisor died while it waited out the backoff before this run: `restarting`, then
    `supervisor-lost` with no `started` before it."""
    if "restarting" not in events or "supervisor-lost" not in events:
        return False
    return "started" not in events[: list(events).index("supervisor-lost")]


def _lost_in_backoff(ev: RunEvidence) -> Finding:
    carried_on = "restart-adopted" in ev.events
    after = (
        "`jobwarden adopt` carried on with the restart: this run started under a new supervisor"
        if carried_on
        else "the restart was never made"
    )
    return Finding(
        "supervisor-lost",
        "The supervisor (shim) died during the restart backoff",
        "jobwarden's per-job supervisor died between runs, while it waited to start this one; nothing of "
        f"the job ran unsupervised (no process of it was running then), and {after}.",
        "info" if carried_on else "warning",
        (
            "event: restarting (the backoff before this run)",
            "event: supervisor-lost, before this run's process was started",
            *(("event: restart-adopted",) if carried_on else ()),
        ),
        "nothing to do; if supervisors die again, see their shim.log"
        if carried_on
        else f"`jobwarden adopt {job_ref(ev)}` starts this run now, with the restart count and policy it "
        f"had; `jobwarden stop {job_ref(ev)}` calls the restart off",
        _pids(ev),
    )


def _who_sent_it(ev: RunEvidence) -> str:
    """Where to look for the sender of a kill. Inside a container the kernel's log is the host's (dmesg is
    refused there) and --mem-limit has nothing to limit: the container's own limit is the one."""
    if ev.engine == "container":
        return (
            "check who sent it on the host: `docker inspect` / `podman inspect` (State.OOMKilled), `kubectl "
            "describe pod` (OOMKilled, Evicted), the host's `dmesg | grep -i oom`"
        )
    return "check who sent it (`last`, scheduler logs, `dmesg | grep -i oom`)" + (
        "" if ev.mem_limit_bytes else "; run with --mem-limit to make memory kills explicit"
    )

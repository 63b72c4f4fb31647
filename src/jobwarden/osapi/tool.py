"""Run an outside diagnostic tool (py-spy, gdb) with a hard deadline: killed and reaped when it overruns.

A tool that attaches to a process can block for ever (ptrace waits on a thread in D state), so every run
has a deadline, and a tool that overruns is killed with its whole process group and reaped before we
return: nothing of it is left behind, whatever it was waiting for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from jobwarden.errors import OsApiError

_DRAIN_AFTER_KILL_S = 5.0  # SIGKILL ends it at once; this only bounds reading what it had written
_GONE_AFTER_KILL_S = 1.0  # a killed helper is a zombie within microseconds; a D-state one, later


class ToolUnavailable(OsApiError):
    """The tool could not be started at all (missing, not executable)."""


@dataclass(frozen=True)
class ToolResult:
    returncode: int | None  # None: killed at the deadline
    stdout: bytes
    stderr: bytes
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_tool(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> ToolResult:
    """Run `argv` to completion or until `timeout_s` has passed, whichever comes first.

    Thread-safe: callers run many at once. The tool gets its own session, so the kill reaches anything
    it started and no terminal signal (Ctrl-C in the CLI) is delivered to it twice."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    except OSError as error:
        raise ToolUnavailable(f"cannot run {argv[0]}: {error.strerror}") from error
    try:
        out, errs = proc.communicate(timeout=max(timeout_s, 0.0))
        return ToolResult(proc.returncode, out, errs, time.monotonic() - started)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, errs = proc.communicate(timeout=_DRAIN_AFTER_KILL_S)
        except subprocess.TimeoutExpired:  # a grandchild that left the group holds the pipe open
            out, errs = b"", b""
            proc.kill()
            proc.wait()
        return ToolResult(None, out or b"", errs or b"", time.monotonic() - started)
    finally:
        if proc.returncode is None:  # an exception (KeyboardInterrupt) between start and reap
            _kill_group(proc)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Our unreaped child: its pid (and so its process group id) cannot have been reused yet.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def start_helper(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, int]:
    """Start `argv` (an absolute path first) in a session of its own, stdin and stdout /dev/null, stderr
    ours, without waiting: (pid, pidfd). posix_spawn, not Popen: nothing is left to warn that it still
    runs when the caller lets it go. Raises ToolUnavailable."""
    from jobwarden.osapi import pidfd as pidfds

    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1)]
    try:
        pid = os.posix_spawn(argv[0], list(argv), dict(env), file_actions=devnull, setsid=True)
    except OSError as error:
        raise ToolUnavailable(f"cannot run {argv[0]}: {error.strerror}") from error
    try:
        return pid, pidfds.open_pidfd(pid)
    except OsApiError as err:  # it ended (and was reaped) at once
        raise ToolUnavailable(f"{argv[0]} ended at once: {err.message}") from err


def reap_helper(pidfd: int) -> None:
    """Collect an ended helper's status if nobody did (the shim's reaper may have)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)


class Captured(NamedTuple):
    """A helper started by `start_captured`: its pid, a pidfd on it, and the memory file its stdout fills."""

    pid: int
    pidfd: int
    out: int


def start_captured(argv: Sequence[str], env: Mapping[str, str]) -> Captured:
    """Start `argv` (an absolute path first) in a session of its own without waiting: stdin /dev/null,
    stdout into an anonymous memory file (nothing to drain while it runs, nothing left on disk), stderr
    dropped. posix_spawn: no Python runs in the child, so any thread of the shim may call it. Raises
    ToolUnavailable."""
    from jobwarden.osapi import pidfd as pidfds

    out = os.memfd_create("jobwarden-capture", os.MFD_CLOEXEC)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out, 1),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ]
    try:
        pid = os.posix_spawn(argv[0], list(argv), dict(env), file_actions=actions, setsid=True)
    except OSError as error:
        os.close(out)
        raise ToolUnavailable(f"cannot run {argv[0]}: {error.strerror}") from error
    try:
        return Captured(pid, pidfds.open_pidfd(pid), out)
    except OsApiError:  # it ended and was reaped at once (the shim's reaper): its output is still here
        return Captured(pid, -1, out)


def captured_output(helper: Captured, limit: int) -> bytes:
    """What the helper wrote to its stdout, its first `limit` bytes."""
    return os.pread(helper.out, limit, 0)


def end_captured(helper: Captured) -> None:
    """Kill what is left of the helper's session (it overran its deadline, or the run is over), collect
    its status if nobody did, and close its descriptors."""
    from jobwarden.osapi import pidfd as pidfds
    from jobwarden.osapi.shell import kill_session
    from jobwarden.osapi.waiting import wait_readable

    if helper.pidfd >= 0:
        if not pidfds.has_exited(helper.pidfd):
            kill_session(helper.pidfd, helper.pid)
            wait_readable([helper.pidfd], _GONE_AFTER_KILL_S)  # SIGKILL is not delivered at once
        reap_helper(helper.pidfd)
        pidfds.close(helper.pidfd)
    os.close(helper.out)

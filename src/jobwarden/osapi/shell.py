"""Short-lived helper commands: an event hook run through /bin/sh with input and a deadline, and a tool's
answer to `--version`.

`run_shell` may run on a thread of the shim, whose main loop reaps every child with waitpid(-1): the
hook's status is read through its pidfd (waitid P_PIDFD), never by a bare pid that may have been reaped
and reused, and the hook runs in a session of its own so a timeout ends everything it started.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.process import WaitStatus, signal_name

_PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2  # include/uapi/linux/pidfd.h, Linux >= 6.9
_AFTER_KILL_S = 5.0


@dataclass(frozen=True)
class ShellOutcome:
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    error: str | None = None  # it could not be started, or its status could not be read

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def describe(self) -> str:
        if self.error:
            return self.error
        if self.timed_out:
            return "timed out (its session was killed)"
        if self.signal:
            return f"killed by {self.signal}"
        return f"exit code {self.exit_code}"


def run_shell(
    command: str,
    stdin: bytes,
    timeout_s: float,
    env: dict[str, str],
    started: Callable[[int], None] = lambda pid: None,
    cancel_fd: int | None = None,
) -> ShellOutcome:
    """`/bin/sh -c command` in a new session, `stdin` on its standard input; killed (the whole session)
    after `timeout_s`, or as soon as `cancel_fd` turns readable. Its stdout and stderr are ours.
    `started` is told the shell's pid at once (the shim must not take its helper for the job's)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        # posix_spawn (vfork + exec, no Python in the child) is safe on any thread of any process
        pid = os.posix_spawn(
            "/bin/sh",
            ["/bin/sh", "-c", command],
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0)],
            setsid=True,
        )
    except OSError as err:
        os.close(write_end)
        return ShellOutcome(error=f"cannot start /bin/sh: {err.strerror}")
    finally:
        os.close(read_end)
    started(pid)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # exited and reaped by someone else within microseconds
        os.close(write_end)
        return ShellOutcome(error="it ended at once (its exit status was collected elsewhere)")
    deadline = time.monotonic() + timeout_s
    try:
        _feed(write_end, stdin, deadline)
        watched = [fd] if cancel_fd is None else [fd, cancel_fd]
        ready = select.select(watched, [], [], max(0.0, deadline - time.monotonic()))[0]
        if fd not in ready:
            kill_session(fd, pid)
            select.select([fd], [], [], _AFTER_KILL_S)
            _collect(fd)
            if ready:
                return ShellOutcome(error="cancelled (its session was killed)")
            return ShellOutcome(timed_out=True)
        return _collect(fd)
    finally:
        os.close(fd)


def _feed(fd: int, data: bytes, deadline: float) -> None:
    """Write `data` and close: a command that does not read its input must not block us past the deadline
    (a broken pipe just means it did not want it)."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view and select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            view = view[os.write(fd, view) :]
    except (BrokenPipeError, BlockingIOError):
        pass
    finally:
        os.close(fd)


def kill_session(fd: int, pid: int) -> None:
    """SIGKILL the hook and its process group. The group signal goes through the leader's pidfd (Linux
    >= 6.9); before that, killpg is used only while the leader is an unreaped child of ours, so its
    pid, and with it the group id, cannot have been reused."""
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL, None, _PIDFD_SIGNAL_PROCESS_GROUP)
        return
    except OSError:
        pass
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    try:
        os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return  # reaped elsewhere: its group id may now name someone else's group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _collect(fd: int) -> ShellOutcome:
    try:
        result = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:  # the shim's reaper got it first: the kernel still knows (Linux >= 6.15)
        raw = pidfds.exit_status(fd)
        if raw is None:
            return ShellOutcome(error="its exit status was collected elsewhere")
        status = WaitStatus.decode(raw)
        return ShellOutcome(status.exit_code, status.signal_name)
    if result is None:
        return ShellOutcome(error="it did not exit")
    if result.si_code == os.CLD_EXITED:
        return ShellOutcome(exit_code=result.si_status)
    return ShellOutcome(signal=signal_name(result.si_status))


def version_of(path: str, timeout_s: float = 10.0) -> str | None:
    """The first line a tool prints for `--version` (py-spy, gdb), or None when it does not run."""
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def python_version(path: str, timeout_s: float = 10.0) -> tuple[int, int, int] | None:
    """The version of a Python interpreter, asked of the interpreter itself (works back to 2.7)."""
    try:
        done = subprocess.run(
            [path, "-c", "import sys; print('%d.%d.%d' % tuple(sys.version_info[:3]))"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        major, minor, micro = (int(x) for x in done.stdout.strip().split("."))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return (major, minor, micro)

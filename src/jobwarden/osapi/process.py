"""Starting, reaping and classifying processes: the shim's fork, the job's exec, subreaper, wait status."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import NamedTuple

_PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> None:
    """Orphaned descendants (double forks, setsid children whose parent exited) are reparented to us
    instead of init, so they stay visible and we reap them (prctl(2), Linux >= 3.4)."""
    import ctypes  # only the shim calls this: loading ctypes would cost every `run` a few milliseconds

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when the thread that forked it exits (prctl(2)): an
    attached CLI whose parent Ray kills, an attached shim whose CLI dies, still hear of it. `parent` is
    the parent's pid taken before (before the fork, in a child): a parent that died in between is seen,
    and this process exits at once as the signal would have ended it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent:
        os._exit(128 + sig)


# /proc/PID/stat fields 48 and 49 (proc(5), Linux >= 3.5), counted from the state field (3) on
_ARG_START, _ARG_END = 48 - 3, 49 - 3


def replace_command_line(title: str) -> None:
    """Overwrite this process's argument strings, which /proc/PID/cmdline shows to every local user, with
    `title`. A forked shim inherits the CLI's argv, `--env SECRET=...` included, for the job's whole life;
    the kernel reads cmdline from the argv area of the stack (mm->arg_start..arg_end), which is ours to
    write. sys.argv is a separate copy and keeps its value."""
    import ctypes

    with open("/proc/self/stat", "rb") as fh:
        fields = fh.read().rpartition(b")")[2].split()
    start, end = int(fields[_ARG_START]), int(fields[_ARG_END])
    if end <= start:
        return
    encoded = title.encode()[: end - start - 1]
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, encoded, len(encoded))


class WaitStatus(NamedTuple):
    """A decoded wait status: exactly one of exit_code / signal is set."""

    raw: int
    exit_code: int | None
    signal: int | None
    core_dumped: bool = False

    @classmethod
    def decode(cls, raw: int) -> WaitStatus:
        if os.WIFSIGNALED(raw):
            return cls(raw, None, os.WTERMSIG(raw), bool(raw & 0x80))
        if os.WIFEXITED(raw):
            return cls(raw, os.WEXITSTATUS(raw), None)
        return cls(raw, None, None)

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.signal) if self.signal else None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def which(program: str, search_path: str) -> str | None:
    """Where execvp finds a bare program name on `search_path` (a PATH value): shutil.which without
    importing shutil (that costs `run` a few milliseconds)."""
    seen = set()
    for directory in search_path.split(os.pathsep):
        if directory in seen:
            continue
        seen.add(directory)
        candidate = os.path.join(directory, program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def reap_any() -> list[tuple[int, int, float]]:
    """Collect every exited child without blocking: [(pid, raw wait status, CPU seconds it used)]. The
    CPU time (wait4's rusage) counts the children it waited for too: what a helper (py-spy) cost."""
    reaped = []
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append((pid, status, usage.ru_utime + usage.ru_stime))
    return reaped


def reap_measured(pid: int, pidfd: int) -> float | None:
    """Reap our exited child `pid` (held by `pidfd`): the CPU seconds it used, or None when it is not
    exited or someone reaped it already."""
    try:
        # WNOWAIT: still our unreaped child, so the pid cannot have been reused by another process
        if os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return None
        reaped, _, usage = os.wait4(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    return usage.ru_utime + usage.ru_stime if reaped == pid else None


def fork_detached() -> int:
    """Fork a child that leaves our session and terminal: 0 in the child, the child's pid in the parent.

    The child is meant to become a shim. Nothing survives in it from the caller but what it inherited
    before the fork, so the caller must hold no threads and no open database connection.
    """
    # A Ctrl-C in the terminal reaches the whole foreground group, the child too until its setsid(): it
    # would raise KeyboardInterrupt inside the new shim, which then ran on as a second CLI. Blocked
    # across the fork, a Ctrl-C stays pending: the parent takes it on unblocking, the child discards it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = -1
    try:
        pid = os.fork()
        if pid == 0:
            os.setsid()  # no controlling terminal: a closing SSH session or tmux pane cannot SIGHUP us
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # discards a pending SIGINT (POSIX)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            # the default, not ignored: an ignored signal stays ignored across exec, in the job
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            # A write to a closed pipe (the report to a `run` interrupted meanwhile, an --on-event hook
            # that exited) must be an EPIPE the shim handles, not its death. The job gets SIG_DFL back
            # at spawn.
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    finally:
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return pid


# What an engine sends the task it runs (Slurm's slurmstepd, Ray's job manager): ended by them, the shim
# of an attached run would die before its handlers are in; blocked, they wait for the shim's handlers.
ENGINE_SIGNALS = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGALRM}
)
# The CLI relays the engine's SIGUSR1 to an attached shim as this (the shim's own SIGUSR1: `jobwarden stop`)
RELAYED_USR1 = signal.SIGRTMIN + 1
# Blocked in an attached shim from its fork until its handlers are in: what the engine sends it, and what the
# CLI relays to it (a real-time signal terminates by default too)
BLOCKED_UNTIL_HANDLED = ENGINE_SIGNALS | {RELAYED_USR1}


def fork_attached() -> int:
    """Fork the shim of an attached run (inside an engine): it stays our child, in our session, so that the
    engine's kill of the task's tree finds it, and it gets SIGTERM when we die (PR_SET_PDEATHSIG), so a
    killed task never leaves the job running. 0 in the child, the child's pid in the parent.

    In the child the engine's signals, and the ones the CLI relays, stay blocked until the shim's handlers
    are in (the supervisor unblocks them); the parent gets its mask back. Constraints: see fork_detached."""
    parent = os.getpid()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_UNTIL_HANDLED)
    pid = -1
    try:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # see fork_detached
            try:  # ctypes loads in here, not in the CLI: only the shim pays for it
                die_with_parent(parent)  # a parent dead before the prctl: exits, the signal would not come
            except OSError:
                os._exit(70)
    finally:
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return pid


def reap(pid: int) -> None:
    """Wait for a child known to be exiting. Nothing to wait for when SIGCHLD is ignored (inherited so
    from some daemons and CI runners): the kernel reaps the child itself."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def redirect_std_streams(log_path: str) -> None:
    """stdin from /dev/null, stdout and stderr appended to `log_path` (0600)."""
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in (null, log):
        if fd > 2:
            os.close(fd)


class SpawnError(Exception):
    def __init__(self, errno_: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno_


# Python ignores SIGPIPE and SIGXFSZ at start-up; exec keeps ignored signals ignored, so a job would
# inherit SIG_IGN and never die of a broken pipe. Reset what the job must see as default.
_RESET_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGCHLD,
    signal.SIGQUIT,
)


def spawn_job(
    argv: list[str], cwd: str, env: dict[str, str], output_path: str, join_cgroup: str | None = None
) -> int:
    """Start the job in its own session, stdin /dev/null, stdout+stderr appended to `output_path` through
    its own fd (never a pipe we read: our death must not SIGPIPE the job). Returns its pid.

    Raises SpawnError with the errno of a failed chdir/exec, reported through a close-on-exec pipe.
    The caller must be single-threaded (it is the shim): only then is work between fork and exec safe.
    """
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    # O_NOFOLLOW: a symlink planted as output.log must not send the job's output (as root) anywhere
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    out_fd = os.open(output_path, flags, 0o600)
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's code
        try:
            _exec_child(argv, cwd, env, out_fd, err_w, join_cgroup)
        finally:
            os._exit(127)
    os.close(err_w)
    os.close(out_fd)
    with os.fdopen(err_r, "rb") as report:
        data = report.read()
    if data:
        os.waitpid(pid, 0)
        code, _, message = data.decode().partition(":")
        raise SpawnError(int(code), message)
    return pid


def _exec_child(
    argv: list[str], cwd: str, env: dict[str, str], out_fd: int, err_w: int, join_cgroup: str | None
) -> None:
    stage = "start"
    try:
        os.setsid()
        for sig in _RESET_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if join_cgroup:
            stage = "join cgroup"
            with open(join_cgroup, "w") as fh:  # before exec: nothing the job forks can escape it
                fh.write("0")  # "0": the writer itself (see the shim's cgroup join file)
        stage = f"chdir to {cwd}"
        os.chdir(cwd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.closerange(3, err_w)
        os.closerange(err_w + 1, 65536)
        stage = f"execute {argv[0]}"
        os.execvpe(argv[0], argv, env)
    except OSError as err:
        os.write(err_w, f"{err.errno}:cannot {stage}: {err.strerror}".encode())

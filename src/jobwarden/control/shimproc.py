"""Starting a shim: fork a detached copy of this process before the job is recorded, let it get ready
while the caller writes the store, then hand it the job and wait on a pipe for its first word (the job's
pid, or why it could not start).

Forking first has two gains for `run`. The shim's preparation (becoming a subreaper, opening the store)
overlaps the caller's store write instead of following it. And the caller's store connection stays open
until the shim has its own: closing the last connection to a WAL database checkpoints it (fsyncs; on a
busy disk tens of ms) and deletes the WAL, which the shim's first write must then recreate. The order is
forced, too: an SQLite library that had the database open when the process forked must not open it again
in the child, so the fork must come first.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from pathlib import Path
from types import TracebackType
from typing import Any

from jobwarden import config
from jobwarden.clock import SystemClock
from jobwarden.errors import JobwardenError, ShimExited, ShimStartFailed
from jobwarden.osapi.process import (
    fork_attached,
    fork_detached,
    reap,
    redirect_std_streams,
    replace_command_line,
    set_child_subreaper,
)
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import Layout
from jobwarden.store import Store


class ForkedShim:
    """A shim waiting for its job: `start` hands it over and returns the shim's report; leaving the
    `with` block without `start` (the job was never recorded) makes the shim exit unseen. A shim that
    exits is reaped here; one that was handed its job outlives the CLI, and init reaps it. An attached
    shim (inside an engine, control.attached) stays the CLI's child: the CLI waits for it and reaps it."""

    def __init__(self, home: Path, mode: str, attached: bool = False) -> None:
        # Loaded before the fork, not after: a forked child copies every page it writes, and importing
        # writes to many, so the same imports take the child about twice as long.
        import jobwarden.shim.run.attempts

        if attached:  # its CLI waits for the run's end, and the end of every attempt decides a restart
            import jobwarden.rules.retry  # noqa: F401

        self.home = home
        self.handed_over = False  # the shim has its job: from now on it starts it, whatever we do
        job_r, self._job_w = os.pipe2(os.O_CLOEXEC)
        self._report_r, report_w = os.pipe2(os.O_CLOEXEC)
        self._must_reap = True  # until the shim has its job
        self.pid = fork_attached() if attached else fork_detached()
        if self.pid == 0:  # the shim: never return into the CLI
            _shim_process(home, mode, job_r, report_w, keep=(job_r, report_w))
        os.close(job_r)
        os.close(report_w)

    def start(self, job_id: int, run: int) -> dict[str, Any]:
        # cleared first: a Ctrl-C after the write must not make the CLI wait for the job's end
        self._must_reap = False
        # the write and its note as one step: a Ctrl-C landing between them (its KeyboardInterrupt is
        # raised at the next bytecode) made the CLI say "not started" over a job that ran (seen at 50 ms)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with contextlib.suppress(BrokenPipeError):  # it died already, so it will not report: said below
                os.write(self._job_w, f"{job_id} {run}\n".encode())
                self.handed_over = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        report = _read_report(self._report_r, self.home, job_id, run)
        if report is None:
            self._must_reap = True  # its end of the pipe closed: it has exited, or is exiting
            log = Layout(self.home).shim_log(job_id, run)
            raise ShimExited(
                f"the supervisor of job {job_id} exited before starting it",
                f"see {log}" if log.exists() else "its error, if it printed one, is above",
            )
        return report

    def __enter__(self) -> ForkedShim:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        os.close(self._job_w)  # a shim still waiting for its job reads end-of-file and exits
        os.close(self._report_r)
        if self._must_reap:
            reap(self.pid)


def fork_shim(home: Path, mode: str, attached: bool = False) -> ForkedShim:
    """Fork the shim of a job yet to be recorded (mode "launch") or of a lost run ("adopt"). The caller
    must hold no open Store (see the module's docstring) and no threads."""
    return ForkedShim(home, mode, attached)


def _shim_process(home: Path, mode: str, job_fd: int, report_fd: int, keep: tuple[int, int]) -> None:
    code = 70
    try:
        _close_inherited(keep)
        code = _shim_main(home, mode, job_fd, report_fd)
    except BaseException:
        import traceback  # only on this path: it costs every `run` milliseconds to import

        traceback.print_exc()
    finally:
        os._exit(code)


def _close_inherited(keep: tuple[int, ...]) -> None:
    """Inherited pipes (a caller's captured stdout) must not stay open: whoever reads them would wait
    for the shim's end."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _shim_main(home: Path, mode: str, job_fd: int, report_fd: int) -> int:
    from jobwarden.shim.run.attempts import supervise_job

    # The CLI's arguments (`--env TOKEN=...`) must not stay readable in /proc for the job's whole life.
    replace_command_line(f"jobwarden shim ({mode})")
    # What needs no job is done while the CLI records it. Orphans of the job are reparented to us
    # from its first instant on.
    set_child_subreaper()
    # Opened before the streams are redirected, even when the CLI was started with fd 1 or 2 closed:
    # SQLite never takes fds 0-2 for a database (it fills them with /dev/null first).
    try:
        store: Store | None = Store(home)
    except JobwardenError:
        store = None  # the CLI meets the same error and says so; if not, it is met again below, logged
    handed = _read_line(job_fd)
    os.close(job_fd)
    if not handed:
        return 0  # the job was never recorded: nothing to supervise
    job_id, run = (int(part) for part in handed.split())
    redirect_std_streams(str(Layout(home).shim_log(job_id, run)))
    store = store or Store(home)
    return supervise_job(store, store.job(job_id), run, SystemClock(), ProcFS(), report_fd, mode)


def _read_line(fd: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            return ""
        data += chunk
    return data.decode()


def _read_report(fd: int, home: Path, job_id: int, run: int) -> dict[str, Any] | None:
    """The shim's first word; None when it closed the pipe without one."""
    data = b""
    while not data.endswith(b"\n"):
        if not _readable(fd, config.SHIM_READY_TIMEOUT_S):
            raise ShimStartFailed(
                f"the supervisor of job {job_id} did not report within {config.SHIM_READY_TIMEOUT_S:.0f}s",
                f"see {home}/jobs/{job_id}/run-{run}/shim.log",
            )
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    if not data:
        return None
    report: dict[str, Any] = json.loads(data)
    return report


def _readable(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


def shim_alive(procfs: ProcFS, pid: int | None, start_time: int | None) -> bool:
    return bool(pid and start_time and procfs.identity_matches(pid, start_time))

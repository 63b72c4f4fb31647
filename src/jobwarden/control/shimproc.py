"""Starting a shim: fork a detached copy of this process, let it become the job's supervisor, and wait
on a pipe for its first word (the job's pid, or why it could not start)."""

from __future__ import annotations

import json
import os
import select
from pathlib import Path
from typing import Any

from jobwarden import config
from jobwarden.clock import SystemClock
from jobwarden.errors import ShimStartFailed
from jobwarden.osapi.process import fork_detached, redirect_std_streams
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import Layout
from jobwarden.store import Store


def start_shim(home: Path, job_id: int, run: int, mode: str) -> tuple[int, dict[str, Any]]:
    """Fork the shim; returns (shim pid, its report). The caller must hold no open Store: the child
    opens its own connection (an SQLite handle must not cross a fork)."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    pid = fork_detached()
    if pid == 0:  # the shim: never return into the CLI
        code = 70
        try:
            os.close(read_fd)
            os.closerange(3, write_fd)  # inherited pipes (a caller's captured stdout) must not stay open
            os.closerange(write_fd + 1, 65536)
            code = _shim_main(home, job_id, run, mode, write_fd)
        except BaseException:
            import traceback  # only on this path: it costs every `run` milliseconds to import

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        return pid, _read_report(read_fd, home, job_id, run)
    finally:
        os.close(read_fd)


def _shim_main(home: Path, job_id: int, run: int, mode: str, report_fd: int) -> int:
    from jobwarden.shim.attempts import supervise_job  # only the shim needs the loop

    # Streams first: a CLI started with fd 0, 1 or 2 closed would otherwise hand one of those numbers to
    # the database, and the redirect would then close it under SQLite's feet.
    redirect_std_streams(str(Layout(home).shim_log(job_id, run)))
    store = Store(home)
    return supervise_job(store, store.job(job_id), run, SystemClock(), ProcFS(), report_fd, mode)


def _read_report(fd: int, home: Path, job_id: int, run: int) -> dict[str, Any]:
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
        raise ShimStartFailed(
            f"the supervisor of job {job_id} exited before starting it",
            f"see {home}/jobs/{job_id}/run-{run}/shim.log",
        )
    report: dict[str, Any] = json.loads(data)
    return report


def _readable(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


def shim_alive(procfs: ProcFS, pid: int | None, start_time: int | None) -> bool:
    return bool(pid and start_time and procfs.identity_matches(pid, start_time))

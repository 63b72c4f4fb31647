"""The end of an attached run, where a container platform shows it: the run's verdict for the CLI to print
last on its stderr (`docker logs`), and the termination message file (`kubectl describe pod`).

The kubelet bind-mounts an empty file at a container's `terminationMessagePath` (default
/dev/termination-log) and reads at most 4 KiB of it once the container has ended. The default path is
written only when that file is there: Docker and Podman mount nothing there, and /dev is the container's
own tmpfs, where a file made by us would tell no one. A planted symlink is never followed, and nothing but
a regular file is written (a FIFO would block the end of the container).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from jobwarden.errors import UsageError
from jobwarden.model import Finding, JobState
from jobwarden.store import JobRecord, RunRecord, Store

DEFAULT_PATH = "/dev/termination-log"


def run_verdict(
    home: Path, job_id: int, run: int | None = None
) -> tuple[JobRecord, RunRecord, list[Finding]]:
    """The job, its run (the latest by default) and the findings, root cause first (none for a success: a
    container that ends well waits for no rules)."""
    with Store(home) as store:
        job = store.job(job_id)
        record = store.run(job.id, run)
        if record.state == JobState.SUCCEEDED:
            return job, record, []
        from jobwarden.verdict.explainer import findings_for

        return job, record, findings_for(store, job, record)


def checked_path(path: str) -> str:
    """--termination-log: where the verdict goes; made absolute now (the run changes no directory, but a
    message must not depend on it), refused when its directory does not exist."""
    if not path or not path.isprintable():
        raise UsageError(
            f"--termination-log {path!r}: not a file name", "e.g. --termination-log /dev/termination-log"
        )
    absolute = os.path.abspath(path)
    if not os.path.isdir(os.path.dirname(absolute)):
        raise UsageError(
            f"--termination-log {path}: no such directory {os.path.dirname(absolute)}",
            "give a file in a directory that exists (Kubernetes mounts the pod's terminationMessagePath)",
        )
    return absolute


def write_termination_log(text: str, path: str | None) -> str | None:
    """Write the message to `path` (--termination-log: created if missing, 0600), or to the default path
    when the platform put a file there. Returns why it could not be written, for an asked-for path; a
    default that is not there is no error."""
    target = path or DEFAULT_PATH
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if path is not None:
        flags |= os.O_CREAT
    try:
        fd = os.open(target, flags, 0o600)
    except OSError as err:
        return None if path is None else f"cannot write the termination message to {target}: {err.strerror}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"not writing the termination message to {target}: not a regular file"
        os.ftruncate(fd, 0)
        data = text.encode()
        while data:
            data = data[os.write(fd, data) :]
    except OSError as err:
        return f"cannot write the termination message to {target}: {err.strerror}"
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return None

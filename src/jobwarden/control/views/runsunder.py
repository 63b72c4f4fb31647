"""What a job runs under, and how its run went in numbers: the part of `status` that Slurm's `scontrol show
job` and `sacct` give (limits, policies, elapsed time, peak memory, restarts).

Nothing secret leaves here: the names of `--env` keys, never their values; of `--notify`, the URL's host
(a Slack or Discord webhook carries its token in the path, a query string may carry a key); of
`--on-event`, the program's name (its arguments may hold a token).
"""

from __future__ import annotations

import os
import shlex
from typing import Any
from urllib.parse import urlsplit

from jobwarden import config
from jobwarden.joboptions import JobOptions
from jobwarden.store import JobRecord, RunRecord
from jobwarden.verdict.signs import DEFAULT_HANG_TIMEOUT_S


def notify_host(url: str | None) -> str | None:
    """'hooks.slack.com' of 'https://hooks.slack.com/services/T0/B0/SECRET': where events go, not the key."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:  # a stored URL that no longer parses (a bad port): nothing of it is shown
        return "(unreadable URL)"
    if not host:
        return "(unreadable URL)"
    return f"{host}:{port}" if port else host


def on_event_program(command: str | None) -> str | None:
    """The program `--on-event` runs, without its arguments."""
    if not command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return os.path.basename(words[0]) if words else None


def runs_under(job: JobRecord, run: RunRecord, restarts: int) -> dict[str, Any]:
    """`status --json`'s `runs_under`: each option as it is in force (defaults filled in), secrets left out.
    `restarts`: how many times the job was started again so far."""
    o: JobOptions = job.options
    hang = DEFAULT_HANG_TIMEOUT_S if o.hang_timeout_s is None else o.hang_timeout_s
    unlimited = o.max_restarts == config.UNLIMITED
    return {
        "timeout_s": o.timeout_s,
        "grace_s": o.grace_s,
        "hang_timeout_s": hang or None,  # null: off
        "hang_timeout_default": o.hang_timeout_s is None,
        "on_hang": o.on_hang,
        "mem_limit_bytes": o.mem_limit_bytes,
        "restart": o.restart,
        "max_restarts": None if unlimited else o.max_restarts,  # null: unlimited
        "restarts": restarts,
        "gpus": o.gpus,
        "gpu_ids": list(o.gpu_ids) if o.gpu_ids is not None else None,  # asked for
        "gpus_used": list(run.gpu_ids),  # given
        "notify_host": notify_host(o.notify),
        "on_event": on_event_program(o.on_event),
        "env_keys": sorted(job.env),
        "queue": o.queue,
        "after": list(o.after),
        "mp_start": o.mp_start,
        "py_hooks": o.py_hooks,
        "log_max_bytes": o.log_cap_bytes or None,  # null: off
        "keep_running": list(o.keep_running),
    }


def elapsed_s(run: RunRecord, now: float) -> float | None:
    """How long the run has run (ended: how long it ran); None before it started."""
    if run.started_at is None:
        return None
    return max(0.0, (run.ended_at or now) - run.started_at)

"""`status`'s lines of what a job runs under (its limits and policies) and of how its run went in numbers,
from `JobStatus.runs_under` (control.views.runsunder), which has already left every secret out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jobwarden.config import DEFAULT_LOG_MAX_BYTES, counted, format_duration, format_size
from jobwarden.text.sanitize import one_line

if TYPE_CHECKING:
    from jobwarden.control.views.jobstatus import JobStatus


def summary_line(status: JobStatus, now: float) -> str | None:
    """sacct's one line: 'elapsed 1m02s   peak memory 143.2M   restarts 1 of 3'. None before it started."""
    run = status.run
    if run.started_at is None:
        return None
    under = status.runs_under
    elapsed = format_duration((run.ended_at or now) - run.started_at)
    cap = under["max_restarts"]
    restarts = (
        f"{status.restarts}"
        if under["restart"] == "no" and not status.restarts
        else (f"{status.restarts} of {'unlimited' if cap is None else cap}")
    )
    peak = format_size(status.peak_rss_bytes)
    return f"  elapsed      {elapsed}   peak memory {peak}   restarts {restarts}"


def runs_under_lines(status: JobStatus) -> Iterator[str]:
    """One line per limit or policy in force; the hang timeout always (its default acts on every job)."""
    u: dict[str, Any] = status.runs_under
    if u["timeout_s"]:
        yield f"  timeout      {format_duration(u['timeout_s'])}, then stopped ({_grace(u)})"
    if u["hang_timeout_s"]:
        default = " (default)" if u["hang_timeout_default"] else ""
        yield f"  hang timeout {format_duration(u['hang_timeout_s'])}{default}; on a hang: {u['on_hang']}"
    else:
        yield "  hang timeout off"
    if u["mem_limit_bytes"]:
        yield f"  memory limit {format_size(u['mem_limit_bytes'])}"
    if u["restart"] != "no":
        cap = "no limit" if u["max_restarts"] is None else f"at most {counted(u['max_restarts'], 'time')}"
        yield f"  restart      {u['restart']}, {cap}"
    if not u["gpus_used"] and (u["gpus"] or u["gpu_ids"]):  # given ones are on the `gpus` line
        asked = counted(u["gpus"], "GPU") if u["gpus"] else "ids " + ",".join(map(str, u["gpu_ids"]))
        yield f"  gpus asked   {asked}"
    if u["notify_host"]:
        yield f"  notify       {one_line(u['notify_host'])} (the URL's path is not shown)"
    if u["on_event"]:
        yield f"  on event     {one_line(u['on_event'])}"
    if u["env_keys"]:
        keys = ", ".join(one_line(k) for k in u["env_keys"])
        yield f"  env          {keys} (--env; values not shown)"
    if u["mp_start"]:
        yield f"  mp start     {u['mp_start']} (--mp-start)"
    if not u["py_hooks"]:
        yield "  py hooks     off (--no-py-hooks): no stacks of deadlocks, no fork records"
    if u["log_max_bytes"] != DEFAULT_LOG_MAX_BYTES:
        cap = format_size(u["log_max_bytes"]) if u["log_max_bytes"] else "off: the log may fill the disk"
        yield f"  log max      {cap}"
    for pattern in u["keep_running"]:
        yield f"  keep running {one_line(pattern)}"
    if u["queue"]:
        yield f"  queue        {one_line(u['queue'])}"
    if u["after"]:
        yield f"  after        {', '.join(f'job {j}' for j in u['after'])}"


def _grace(u: dict[str, Any]) -> str:
    return f"SIGTERM, SIGKILL {format_duration(u['grace_s'])} later"

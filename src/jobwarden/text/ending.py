"""The one line `run -f`, `run -w`, `rerun -w` and `wait` print on stderr when the job they waited for
ends: how it ended, after how long, and where to look next (a failed job's `explain`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobwarden.config import format_duration
from jobwarden.model import JobState

if TYPE_CHECKING:
    from jobwarden.store import RunRecord


def end_line(job_name: str, run: RunRecord) -> str:
    """'jobwarden: job 7 (train) failed: exit code 1 after 12s; why: jobwarden explain 7'."""
    from jobwarden.text.render import how_it_ended
    from jobwarden.text.sanitize import one_line

    took = ""
    if run.started_at is not None and run.ended_at is not None:
        took = f" after {format_duration(run.ended_at - run.started_at)}"
    attempt = f", run {run.n}" if run.n > 1 else ""
    line = f"jobwarden: job {run.job_id} ({one_line(job_name)}{attempt}) {how_it_ended(run)}{took}"
    if run.state == JobState.LOST:
        return f"{line}: its supervisor died, so how the job ended is unknown; jobwarden status {run.job_id}"
    if run.state != JobState.SUCCEEDED:
        return f"{line}; why: jobwarden explain {run.job_id}"
    return line

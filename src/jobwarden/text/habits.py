"""The lines `status` adds for what issue 21's everyday habits record: where a rerun came from, what
--log-max dropped, the processes kept past the end (--keep-running), notifications that failed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from jobwarden.config import format_size
from jobwarden.text.sanitize import one_line

if TYPE_CHECKING:
    from jobwarden.control.views.jobstatus import JobStatus


def habit_lines(status: JobStatus) -> Iterator[str]:
    job, run = status.job, status.run
    if job.rerun_of is not None:
        yield f"  rerun of     job {job.rerun_of}"
    dropped = status.log_dropped
    if dropped and dropped["unsupported"]:
        yield (
            f"  WARNING      --log-max {format_size(dropped['max_bytes'])} cannot be kept: the file system "
            f"cannot free part of a file ({one_line(str(dropped['unsupported']))})"
        )
    elif dropped:
        yield (
            f"  log dropped  {format_size(dropped['bytes'])} of output, from byte {dropped['start']} to "
            f"{dropped['end']}, to keep the log within --log-max {format_size(dropped['max_bytes'])} "
            "(its start and newest part are kept)"
        )
    for kept in run.kept:
        yield (
            f"  kept         pid {kept['pid']} ({one_line(str(kept.get('cmdline', '')))[:60]}), left running "
            f"by --keep-running; jobwarden stop {job.id} ends it"
        )
    for failure in status.notify_failures:
        yield (
            f"  WARNING      the {failure['event']!r} notification to {failure['target']} failed: "
            f"{one_line(str(failure['detail']))}"
        )

"""`jobwarden status [JOB]`: how a job is doing, or how it ended; in a terminal, with CPU and RSS
sparklines of its last minutes."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from jobwarden.cli.common import open_procfs, print_json, print_lines, say_malformed_samples

if TYPE_CHECKING:
    from pathlib import Path

    from jobwarden.control.views.jobstatus import JobStatus

HELP = "how a job is doing, or how it ended"


def add_arguments(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "job", metavar="JOB", nargs="?", help="an id, a name (its newest job) or @last (the default)"
    )
    status.add_argument("--run", type=int, metavar="N", help="an earlier attempt (default: the last)")
    status.add_argument("--json", action="store_true", help="the whole record as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.clock import SystemClock
    from jobwarden.control.jobs import LAST_JOB
    from jobwarden.paths import home_dir
    from jobwarden.text import render

    status = _job_status(args.job or LAST_JOB, args.run)
    if args.job is None:
        from jobwarden.cli.joboutput import say_newest

        say_newest("status", status.job.id, status.job.name)
    if args.json:
        print_json(status.to_json())
    else:
        print_lines(render.status_report(status, SystemClock().wall()))
        print_lines(status_sparklines(home_dir(), status))
    return 0


def _job_status(job_ref: str, run_n: int | None) -> JobStatus:
    from jobwarden.control.views.jobstatus import status_of
    from jobwarden.paths import home_dir

    return status_of(home_dir(), open_procfs(), job_ref, run_n)


STATUS_WINDOW_S = 600.0  # the last minutes `status` draws


def status_sparklines(home: Path, status: JobStatus) -> list[str]:
    """CPU and RSS over the last minutes, for `status` in a terminal."""
    from jobwarden.cli.metricsview import spark_width
    from jobwarden.cli.metricsview import status_sparklines as lines
    from jobwarden.clock import SystemClock
    from jobwarden.control.views.metrics import run_samples
    from jobwarden.text.term import terminal_width

    now, width = SystemClock().wall(), terminal_width()
    end = status.run.ended_at or now  # an ended run: its last minutes
    found = run_samples(
        home,
        status.job.id,
        status.run.n,
        since=end - STATUS_WINDOW_S,
        points=spark_width(width, "    "),
        now=now,
    )
    say_malformed_samples(found.malformed, status.job.id)
    return list(lines(found.samples, width))

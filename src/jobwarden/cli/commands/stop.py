"""`jobwarden stop JOB`: end a job and everything it started; never a guessed job."""

from __future__ import annotations

import argparse

from jobwarden import config
from jobwarden.cli.common import open_procfs, print_json, print_lines
from jobwarden.errors import UsageError

HELP = "end a job and everything it started"


def add_arguments(stop: argparse.ArgumentParser) -> None:
    stop.add_argument(
        "job", metavar="JOB", nargs="?", help="an id, a name (its newest job) or @last; never guessed"
    )
    stop.add_argument("--grace", metavar="DUR", help="SIGTERM -> SIGKILL delay (default: the job's, 10s)")
    stop.add_argument(
        "--force", action="store_true", help="SIGKILL what is left now; cuts short a stop already waiting"
    )
    stop.add_argument("--json", action="store_true", help="how it ended and what survived, as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.lifecycle import stop
    from jobwarden.paths import home_dir
    from jobwarden.text import render

    if args.job is None:
        raise UsageError("stop needs a JOB: it never guesses which job to end", _running_jobs_hint())
    if args.force and args.grace is not None:
        raise UsageError("--force and --grace exclude each other", "--force is --grace 0: SIGKILL now")
    grace = 0.0 if args.force else config.optional_duration(args.grace, "--grace")
    result = stop(home_dir(), open_procfs(), args.job, grace)
    if args.json:
        print_json(result.to_json())
    else:
        print_lines(render.stop_report(result))
    return 1 if result.survivors else 0


def _running_jobs_hint() -> str:
    from jobwarden.control.views.joblist import views_of
    from jobwarden.paths import home_dir
    from jobwarden.text.sanitize import terminal_text

    views = views_of(home_dir(), open_procfs(), include_ended=False)
    if not views:
        return "no job is running now"
    named = ", ".join(f"{v.job.id} ({terminal_text(v.job.name)})" for v in views[-8:])
    more = f" and {len(views) - 8} more (jobwarden ps)" if len(views) > 8 else ""
    return f"running: {named}{more}; e.g. jobwarden stop {views[-1].job.id}"

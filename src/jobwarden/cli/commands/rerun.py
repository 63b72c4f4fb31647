"""`jobwarden rerun JOB`: the same command, cwd, --env and options, as a new job."""

from __future__ import annotations

import argparse
import sys

from jobwarden.cli.launched import launched_said

HELP = "start a job again: the same command, cwd, --env and options, as a new job"


def add_arguments(rerun: argparse.ArgumentParser) -> None:
    rerun.add_argument("job", metavar="JOB", help="the job to run again: an id, a name or @last")
    rerun.add_argument("-f", "--follow", action="store_true", help="stream the output, then exit as it did")
    rerun.add_argument(
        "-w", "--wait", action="store_true", help="wait for the end; exit with the job's status"
    )
    rerun.add_argument("--json", action="store_true", help="print the new job as JSON, with rerun_of")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.rerun import rerun
    from jobwarden.paths import home_dir
    from jobwarden.text.sanitize import one_line

    launched, old = rerun(home_dir(), args.job)
    if not args.json:
        print(f"jobwarden: job {launched.id} reruns job {old.id} ({one_line(old.name)})", file=sys.stderr)
    return launched_said(launched, args.json, args.follow, args.wait, {"rerun_of": old.id})

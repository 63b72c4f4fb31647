"""`jobwarden health [JOB]`: a liveness probe, its answer in the exit status."""

from __future__ import annotations

import argparse

from jobwarden.cli.common import print_json, print_lines

HELP = (
    "a liveness probe: exit 0 if the job runs and is not hung (or succeeded), 1 if hung or failed, 2 if "
    "there is no such job"
)


def add_arguments(health: argparse.ArgumentParser) -> None:
    health.add_argument("job", metavar="JOB", nargs="?", help="default: the newest job")
    health.add_argument("--json", action="store_true", help="the verdict as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.health import health
    from jobwarden.paths import home_dir

    verdict = health(home_dir(), args.job)
    if args.json:
        print_json(verdict.to_json())
    else:
        job = f"job {verdict.job_id}: " if verdict.job_id is not None else ""
        print_lines([f"{verdict.status}: {job}{verdict.reason}"])  # a reason may quote a job's reference
    return verdict.exit_code

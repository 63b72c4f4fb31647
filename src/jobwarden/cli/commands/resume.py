"""`jobwarden resume`: after a reboot, mark the runs it ended and start again those with --restart."""

from __future__ import annotations

import argparse

from jobwarden.cli.common import open_procfs, print_json

HELP = "after a reboot: mark the runs it ended, start again those with --restart"


def add_arguments(resume: argparse.ArgumentParser) -> None:
    resume.add_argument("--json", action="store_true", help="what was marked and started, as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.boot.reboot import resume
    from jobwarden.paths import home_dir
    from jobwarden.text.sanitize import one_line

    done = resume(home_dir(), open_procfs())
    if args.json:
        print_json([r.to_json() for r in done])
    elif not done:
        print("no job was ended by a reboot")
    for r in [] if args.json else done:
        print(f"job {r.job_id} ({one_line(r.name)}), ended by the reboot in run {r.ended_run}: {r.why}")
    return 0

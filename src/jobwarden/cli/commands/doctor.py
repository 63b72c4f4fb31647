"""`jobwarden doctor`: what jobwarden can do on this machine, and how to fix what it cannot."""

from __future__ import annotations

import argparse

from jobwarden.cli.common import print_json, print_lines

HELP = "check what jobwarden can do on this machine, and how to fix it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="the report as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.doctor.checks import report_json, run_checks
    from jobwarden.control.doctor.hostfacts import gather
    from jobwarden.paths import home_dir
    from jobwarden.text import render

    report = report_json(run_checks(gather(home_dir())))
    if args.json:
        print_json(report)
    else:
        print_lines(render.doctor_report(report))
    return 0 if report["ok"] else 1

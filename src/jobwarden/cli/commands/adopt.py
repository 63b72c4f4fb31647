"""`jobwarden adopt JOB`: supervise again a job whose supervisor died."""

from __future__ import annotations

import argparse

from jobwarden.cli.common import open_procfs, print_json, print_lines

HELP = "supervise again a job whose supervisor died"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    parser.add_argument("--json", action="store_true", help="the answer as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.lifecycle import adopt
    from jobwarden.paths import home_dir

    report = adopt(home_dir(), open_procfs(), args.job)
    if args.json:
        print_json(report)
    elif report.get("restarted"):  # its supervisor had died in a restart's backoff: the restart is made
        how = f"started run {report['run']} (pid {report['pid']})" if report.get("pid") else "queued run"
        print_lines([f"adopted job {args.job}: {how}, the restart its supervisor died waiting to make"])
    else:
        pids = [str(p) for p in report.get("pids", [])]  # type: ignore[attr-defined]
        print_lines([f"adopted job {args.job}: watching {len(pids)} process(es): {' '.join(pids)}"])
    return 0

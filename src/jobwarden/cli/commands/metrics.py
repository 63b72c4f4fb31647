"""`jobwarden metrics JOB`: a job's CPU, memory, I/O and GPU use over time, or as Prometheus text."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from jobwarden import config
from jobwarden.cli.common import print_json, say_malformed_samples

if TYPE_CHECKING:
    from pathlib import Path

HELP = "a job's CPU, memory, I/O and GPU use over time"


def add_arguments(metrics: argparse.ArgumentParser) -> None:
    metrics.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    metrics.add_argument("--run", type=int, metavar="N", help="an earlier attempt")
    metrics.add_argument("--since", metavar="DUR", help="only the last DUR (e.g. 10m, 6h, 2d)")
    metrics.add_argument("--json", action="store_true", help="the samples as a JSON list, oldest first")
    metrics.add_argument(
        "--prometheus", action="store_true", help="the Prometheus text exposition, as /metrics serves it"
    )


def handle(args: argparse.Namespace) -> int:
    from jobwarden.paths import home_dir

    return metrics(home_dir(), args)


def metrics(home: Path, args: argparse.Namespace) -> int:
    from jobwarden.cli.metricsview import metrics_report, spark_width
    from jobwarden.clock import SystemClock
    from jobwarden.control.views.metrics import run_samples
    from jobwarden.text.sanitize import terminal_text
    from jobwarden.text.term import for_terminal, terminal_width

    now = SystemClock().wall()
    since = now - config.parse_duration(args.since, "--since") if args.since is not None else None
    width = terminal_width()
    if args.prometheus:
        exposition = _prometheus(home, args.job, args.run)  # byte-exact for a scraper, safe for a terminal
        sys.stdout.write(terminal_text(exposition) if sys.stdout.isatty() else exposition)
        return 0
    points = None if args.json else spark_width(width)
    found = run_samples(home, args.job, args.run, since=since, points=points, now=now)
    say_malformed_samples(found.malformed, found.job_id)
    if args.json:
        print_json([s.to_json() for s in found.samples])
    else:
        for line in for_terminal(metrics_report(found.name, found.job_id, found.run, found.samples, width)):
            print(line)
    return 0


def _prometheus(home: Path, job_ref: str, run_n: int | None) -> str:
    from jobwarden.control.prometheus import job_exposition
    from jobwarden.osapi.procfs import ProcFS

    return job_exposition(home, ProcFS(), job_ref, run_n)

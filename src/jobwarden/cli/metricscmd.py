"""The `metrics` command, and the sparklines `status` adds in a terminal (handlers.py imports this lazily)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from jobwarden import config
from jobwarden.cli.metricsview import metrics_report, spark_width
from jobwarden.clock import SystemClock
from jobwarden.control.metrics import job_samples
from jobwarden.store import Store
from jobwarden.text.sanitize import terminal_text
from jobwarden.text.term import for_terminal, terminal_width

if TYPE_CHECKING:
    from jobwarden.control.jobstatus import JobStatus

STATUS_WINDOW_S = 600.0  # the last minutes `status` draws


def metrics(home: Path, args: argparse.Namespace) -> int:
    now = SystemClock().wall()
    since = now - config.parse_duration(args.since, "--since") if args.since is not None else None
    width = terminal_width()
    with Store(home) as store:
        job = store.job(args.job)
        run = store.run(job.id, args.run)
        if args.prometheus:
            exposition = _prometheus(store, job.id, run.n)  # byte-exact for a scraper, safe for a terminal
            sys.stdout.write(terminal_text(exposition) if sys.stdout.isatty() else exposition)
            return 0
        points = None if args.json else spark_width(width)
        samples = job_samples(store, job.id, run.n, since=since, points=points, now=now)
        _say_skipped(store.malformed_samples, job.id)
    if args.json:
        print(json.dumps([s.to_json() for s in samples], indent=2))
    else:
        for line in for_terminal(metrics_report(job.name, job.id, run.n, samples, width)):
            print(line)
    return 0


def _prometheus(store: Store, job_id: int, run: int) -> str:
    from jobwarden.control.prometheus import job_exposition
    from jobwarden.osapi.procfs import ProcFS

    return job_exposition(store, ProcFS(), job_id, run)


def status_sparklines(home: Path, status: JobStatus) -> list[str]:
    """CPU and RSS over the last minutes, for `status` in a terminal."""
    from jobwarden.cli.metricsview import status_sparklines as lines

    now, width = SystemClock().wall(), terminal_width()
    end = status.run.ended_at or now  # an ended run: its last minutes
    with Store(home) as store:
        samples = job_samples(
            store,
            status.job.id,
            status.run.n,
            since=end - STATUS_WINDOW_S,
            points=spark_width(width, "    "),
            now=now,
        )
        _say_skipped(store.malformed_samples, status.job.id)
    return list(lines(samples, width))


def _say_skipped(count: int, job_id: int) -> None:
    if count:
        print(
            f"jobwarden: skipped {count} malformed sample row(s) of job {job_id} (not as jobwarden writes)",
            file=sys.stderr,
        )

"""`jobwarden wait JOB`: block until a job ends, and exit with its status."""

from __future__ import annotations

import argparse
import sys

from jobwarden import config
from jobwarden.cli.launched import wait_exit

HELP = "block until a job ends; exit with its status (124: still running at --timeout; 125: no such job)"


def add_arguments(wait: argparse.ArgumentParser) -> None:
    wait.add_argument("job", metavar="JOB", help="an id, a name or @last")
    wait.add_argument(
        "--timeout",
        metavar="DUR",
        help="give up after DUR: exit 124 if the job still runs (as timeout(1))",
    )
    wait.add_argument("--json", action="store_true", help="print how it ended as JSON")


def handle(args: argparse.Namespace) -> int:
    """Exit codes: the job's status (128+N for signal N), 124 when it still runs at --timeout (as
    timeout(1)), 125 when there is no such job (timeout(1)'s code for a failure of its own)."""
    from jobwarden.errors import JobNotFound

    timeout = config.optional_duration(args.timeout, "--timeout")
    try:
        return wait_exit(args.job, timeout, args.json, said=not args.json)
    except JobNotFound as err:
        print(f"jobwarden: {err.message}", file=sys.stderr)
        print(f"  {err.remedy}", file=sys.stderr)
        return WAIT_NO_SUCH_JOB


WAIT_NO_SUCH_JOB = 125

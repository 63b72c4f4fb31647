"""`jobwarden dump JOB`: the Python and native stacks of every process of a job, now."""

from __future__ import annotations

import argparse
import sys

from jobwarden import config
from jobwarden.cli.common import open_procfs, print_json, print_lines

HELP = "the Python and native stacks of every process of a job, now"


def add_arguments(dump: argparse.ArgumentParser) -> None:
    dump.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    dump.add_argument(
        "--no-native", action="store_true", help="Python frames only: each process is paused for less time"
    )
    dump.add_argument("--timeout", metavar="DUR", help="the most the whole capture may take (default 5s)")
    dump.add_argument("--json", action="store_true", help="the stacks as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.dump import DEFAULT_TIMEOUT_S, dump_job
    from jobwarden.paths import home_dir
    from jobwarden.text import render

    timeout = config.optional_duration(args.timeout, "--timeout")
    result = dump_job(
        home_dir(),
        open_procfs(),
        args.job,
        native=not args.no_native,
        timeout_s=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
    )
    if args.json:
        if not result.live:
            print(f"jobwarden: {render.dump_heading(result)}", file=sys.stderr)
        print_json(result.to_json())
    else:
        print_lines(render.dump_report(result))
    return 0

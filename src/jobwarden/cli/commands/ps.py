"""`jobwarden ps`: list jobs, filtered by state, name and age."""

from __future__ import annotations

import argparse
import os
import sys

from jobwarden import config
from jobwarden.cli.common import open_procfs, print_json, print_lines
from jobwarden.errors import UsageError

HELP = "list jobs"


def add_arguments(ps: argparse.ArgumentParser) -> None:
    ps.add_argument("-a", "--all", action="store_true", help="include ended jobs")
    ps.add_argument("--last", metavar="N", help="only the N newest of the jobs listed")
    ps.add_argument(
        "-w",
        "--wide",
        action="store_true",
        help="a VERDICT column (each finding's title) and whole commands, never cut to the terminal",
    )
    ps.add_argument(
        "--state",
        metavar="STATE[,STATE]",
        help="only jobs in these states (queued, starting, running, hung, stopping, restarting, succeeded, "
        "failed, stopped, lost); ended states need no --all",
    )
    ps.add_argument(
        "--name", metavar="PATTERN", help="only jobs whose name matches (shell wildcards: 'lr-*')"
    )
    ps.add_argument(
        "--since",
        metavar="DUR",
        help="only jobs not over, or that ended in the last DUR (e.g. 2h: what the last 2 hours saw)",
    )
    ps.add_argument("--json", action="store_true", help="the jobs as a JSON list")


def handle(args: argparse.Namespace) -> int:
    import gc

    from jobwarden.clock import SystemClock
    from jobwarden.paths import home_dir
    from jobwarden.text import render

    # A list of 10,000 jobs is some 100,000 small objects made at once, which the cycle collector would
    # walk again and again (~15 % of `ps --all`); this process makes no cycles worth collecting, and exits.
    gc.disable()
    from jobwarden.control.views.joblist import home_disk_full, views_of

    last = None if args.last is None else config.parse_count(args.last, "--last")
    if last == 0:
        raise UsageError("bad --last '0': must be 1 or more", "e.g. jobwarden ps --all --last 50")
    states = None if args.state is None else config.parse_states(args.state)
    since = None if args.since is None else config.parse_duration(args.since, "--since")
    filtered = states is not None or args.name is not None
    # an ended state asked for needs the ended jobs; a filter pages after filtering, not before
    include_ended = args.all or bool(states and states - _UNFINISHED_WORDS)
    views = views_of(
        home_dir(),
        open_procfs(),
        include_ended=include_ended,
        limit=None if filtered else last,
        metrics=args.json,
        ended_since=None if since is None or include_ended else SystemClock().wall() - since,
    )
    full = home_disk_full(home_dir())
    if filtered or (since is not None and include_ended):
        from jobwarden.control.views.joblist import filtered_views

        ended_since = None if since is None else SystemClock().wall() - since
        views = filtered_views(views, states, args.name, ended_since)
        views = views[-last:] if last is not None else views
    if full is not None:
        print(
            f"jobwarden: WARNING: the disk holding {home_dir()} is full ({full} bytes free): no job's end or "
            "finding can be recorded, and output written now is lost",
            file=sys.stderr,
        )
    if args.json:
        print_json([v.summary_json() for v in views])
    else:
        # into a pipe or a file, whole lines: `ps | grep` must find what a terminal would cut; unless
        # COLUMNS says a width, as procps' ps does
        width = None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 0
        print_lines(render.ps_table(views, SystemClock().wall(), wide=args.wide, width=width))
    return 0


_UNFINISHED_WORDS = frozenset({"queued", "starting", "running", "hung", "stopping", "restarting", "lost"})

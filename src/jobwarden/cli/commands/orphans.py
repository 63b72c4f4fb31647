"""`jobwarden orphans [--kill]`: processes that should not be alive: leftovers of ended jobs, stray GPU
holders."""

from __future__ import annotations

import argparse

from jobwarden import config
from jobwarden.cli.common import open_procfs, print_json, print_lines

HELP = "list processes that should not be alive: leftovers of ended jobs, stray GPU holders"


def add_arguments(orphans: argparse.ArgumentParser) -> None:
    orphans.add_argument("--kill", action="store_true", help="end them (SIGTERM, grace, SIGKILL)")
    orphans.add_argument("--grace", metavar="DUR", help="with --kill: SIGTERM -> SIGKILL delay (default 10s)")
    orphans.add_argument(
        "--json", action="store_true", help="the strays (with --kill: what became of them) as JSON"
    )


def handle(args: argparse.Namespace) -> int:
    from jobwarden.clock import SystemClock
    from jobwarden.control.orphans import find_strays, release_dead_cgroups
    from jobwarden.paths import home_dir
    from jobwarden.text import render

    procfs, now = open_procfs(), SystemClock().wall()
    grace = config.optional_duration(args.grace, "--grace")
    strays = find_strays(home_dir(), procfs, now)
    release_dead_cgroups()
    listed = [s.to_json(now) for s in strays]
    if not args.kill:
        if args.json:
            print_json(listed)
        else:
            print_lines(render.orphans_table(listed))
        return 0
    from jobwarden.control.killer import end_strays, outcomes_json

    results = end_strays(procfs, strays, grace if grace is not None else config.DEFAULT_GRACE_S)
    outcomes = outcomes_json(listed, results)
    if args.json:
        print_json(outcomes)
    else:
        print_lines(render.kill_report(outcomes))
    return 0 if all(r.ended for r in results) else 1

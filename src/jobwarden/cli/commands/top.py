"""`jobwarden top`: the terminal UI; textual and rich load in its handler alone."""

from __future__ import annotations

import argparse

HELP = "a live view of the jobs in the terminal; stop, dump, explain (needs jobwarden[tui])"


def add_arguments(top: argparse.ArgumentParser) -> None:
    top.add_argument("--interval", default="2", metavar="DUR", help="refresh every DUR (default 2s)")
    top.add_argument("-a", "--all", action="store_true", help="include ended jobs (key a toggles)")
    top.add_argument("--read-only", action="store_true", help="no stop or dump keys: look, never touch")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.paths import home_dir
    from jobwarden.tui.command import top  # textual and rich load here, never on other commands' path

    return top(home_dir(), args.interval, args.all, args.read_only)

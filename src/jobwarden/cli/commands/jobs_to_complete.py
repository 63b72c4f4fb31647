"""`jobwarden _jobs` (hidden): the ids and names a shell completion offers, one a line."""

from __future__ import annotations

import argparse

from jobwarden.cli.common import print_lines

HELP = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.jobs import job_refs
    from jobwarden.paths import home_dir

    # one a line: a name that is not printable (an old store's) is left out
    print_lines(r for pair in job_refs(home_dir()) for ref in pair if (r := str(ref)).isprintable())
    return 0

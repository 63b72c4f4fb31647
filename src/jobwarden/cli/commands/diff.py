"""`jobwarden diff A [B] [--run N] [--json]`: what changed between two runs (control.changes), one line per
change, "nothing changed" when nothing did."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import TYPE_CHECKING

from jobwarden.cli.common import print_json

if TYPE_CHECKING:
    from pathlib import Path

    from jobwarden.control.changes import RunDiff

HELP = (
    "what changed between two runs (packages, git commit, env keys, python, host, GPUs), or since the "
    "last success of the same command"
)


def add_arguments(diff: argparse.ArgumentParser) -> None:
    diff.add_argument("job", metavar="A", help="the run to look at: an id, a name (its newest job) or @last")
    diff.add_argument(
        "other",
        metavar="B",
        nargs="?",
        help="compare with this job's last run (default: the last run of A's command, in A's directory, "
        "that succeeded before A's run started)",
    )
    diff.add_argument("--run", type=int, metavar="N", help="A's run N (default: its last)")
    diff.add_argument(
        "--json", action="store_true", help="what changed as JSON: {a, b, changes: [{what, before, after}]}"
    )


def handle(args: argparse.Namespace) -> int:
    from jobwarden.paths import home_dir

    return diff(home_dir(), args)


def diff(home: Path, args: argparse.Namespace) -> int:
    from jobwarden.control.changes import diff_runs

    found = diff_runs(home, args.job, args.other, args.run)
    if args.json:
        print_json(found.to_json())
    else:
        from jobwarden.text.term import for_terminal  # package names, branches, commands: the job's words

        for line in for_terminal(diff_report(found)):
            print(line)
    return 0


def diff_report(found: RunDiff) -> Iterator[str]:
    """Which runs, from the earlier to the later, then each change on a line of its own."""
    before, after = found.before, found.after
    if found.baseline:
        yield f"since {before.said()}, the last success of the same command, to {after.said()}:"
    else:
        yield f"from {before.said()} to {after.said()}:"
    if not found.changes:
        yield "nothing changed"
    for change in found.changes:
        yield change.line()

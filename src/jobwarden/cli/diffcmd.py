"""`jobwarden diff A [B] [--run N] [--json]`: what changed between two runs (control.changes), one line per
change, "nothing changed" when nothing did."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from jobwarden.control.changes import RunDiff, diff_runs
from jobwarden.store import Store


def diff(home: Path, args: argparse.Namespace) -> int:
    with Store(home) as store:
        found = diff_runs(store, args.job, args.other, args.run)
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
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

"""What several commands share: the /proc reader, the edge that prints (a job's words never reach the
terminal raw), and the note said before a command acts on a JOB given by a name that older live jobs
share. Each import is made by the function that needs it: every command loads this module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path


def open_procfs() -> Any:
    from jobwarden.osapi.procfs import ProcFS

    return ProcFS()


def print_lines(lines: Iterable[str]) -> None:
    from jobwarden.text.term import for_terminal  # the edge: no byte of a job's reaches the terminal raw

    for line in for_terminal(lines):
        print(line)


def print_json(obj: object) -> None:
    import json

    print(json.dumps(obj, indent=2))


def say_malformed_samples(count: int, job_id: int) -> None:
    """`metrics` and `status`: sample rows the store holds that jobwarden did not write, skipped."""
    if count:
        print(
            f"jobwarden: skipped {count} malformed sample row(s) of job {job_id} (not as jobwarden writes)",
            file=sys.stderr,
        )


def note_namesakes(args: argparse.Namespace) -> None:
    """A JOB given by a name (never an id or @last: those cost nothing) that older live jobs share."""
    from jobwarden.paths import home_dir

    ref = getattr(args, "job", None)
    if isinstance(ref, list):  # `logs -f 3 5 7`
        for one in ref:
            note_namesakes(argparse.Namespace(**{**vars(args), "job": one}))
        return
    if (
        not isinstance(ref, str)
        or not ref
        or ref.isdigit()
        or ref.startswith("@")
        or args.command.startswith("_")
    ):
        return
    _note_namesakes_of(home_dir(), ref)


def _note_namesakes_of(home: Path, ref: str) -> None:
    """A JOB given by a name that names more than one job not over yet: the newest is meant (Store.job),
    and the user is told, once, before the command acts on it."""
    from jobwarden.control.jobs import older_namesakes
    from jobwarden.errors import JobwardenError

    try:
        job, older = older_namesakes(home, ref)
    except (JobwardenError, UnicodeError):
        return  # no such job, an odd reference: the command itself says what is wrong
    if older:
        ids = ", ".join(str(i) for i in older)
        print(
            f"jobwarden: note: {ref!r} names job {job.id}, the newest of that name; older job"
            f"{'s' if len(older) > 1 else ''} {ids} of that name {'are' if len(older) > 1 else 'is'} not "
            "over yet (give an id to mean one of them)",
            file=sys.stderr,
        )

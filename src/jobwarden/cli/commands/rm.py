"""`jobwarden rm JOB` or `rm --ended`: forget ended jobs and delete their logs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobwarden import config
from jobwarden.cli.common import open_procfs
from jobwarden.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from jobwarden.osapi.procfs import ProcFS

HELP = "forget ended jobs and delete their logs (one JOB, or --ended)"


def add_arguments(rm: argparse.ArgumentParser) -> None:
    rm.add_argument("job", metavar="JOB", nargs="?", help="the job to remove (or use --ended)")
    rm.add_argument(
        "--ended", action="store_true", help="remove every ended job (succeeded, failed, stopped)"
    )
    rm.add_argument("--failed", action="store_true", help="with --ended: only the failed ones")
    rm.add_argument(
        "--older-than", metavar="DUR", help="with --ended: only those that ended more than DUR ago (e.g. 7d)"
    )
    rm.add_argument(
        "-y", "--yes", action="store_true", help="do not ask for confirmation (needed without a terminal)"
    )


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.lifecycle import remove
    from jobwarden.paths import home_dir

    if args.ended:
        return rm_ended(home_dir(), open_procfs(), args)
    for flag, given in (("--failed", args.failed), ("--older-than", args.older_than is not None)):
        if given:
            raise UsageError(f"rm {flag} goes with --ended", f"e.g. jobwarden rm --ended {flag} ...")
    if args.job is None:
        raise UsageError(
            "rm needs a JOB, or --ended", "e.g. jobwarden rm 3, or jobwarden rm --ended --older-than 7d"
        )
    job_id = remove(home_dir(), open_procfs(), args.job)
    print(f"removed job {job_id}")
    return 0


def rm_ended(home: Path, procfs: ProcFS, args: argparse.Namespace) -> int:
    from jobwarden.clock import SystemClock
    from jobwarden.control.cleanup import ended_jobs, remove_jobs

    if args.job is not None:
        raise UsageError("rm: give a JOB or --ended, not both", "e.g. jobwarden rm --ended --failed")
    older = config.optional_duration(args.older_than, "--older-than")
    found = ended_jobs(home, procfs, failed_only=args.failed, older_than_s=older, now=SystemClock().wall())
    what = _rm_summary(found.jobs, found.failed, found.bytes_on_disk, args.failed)
    for job_id in found.keeping:
        print(
            f"jobwarden: left job {job_id}: processes it kept (--keep-running) still run; "
            f"jobwarden stop {job_id} ends them",
            file=sys.stderr,
        )
    if not found.jobs:
        print("no ended jobs to remove" + (" that match" if args.failed or older else ""))
        return 0
    if not args.yes and not _confirmed(f"remove {what}? [y/N] "):
        print("nothing removed")
        return 1
    remove_jobs(home, [job.id for job, _ in found.jobs])
    print(f"removed {what}")
    return 0


def _rm_summary(jobs: Sequence[Any], failed: int, size: int, failed_only: bool) -> str:
    """'12 ended jobs (3 failed) and their logs (1.2G)'."""
    n = len(jobs)
    kind = "failed" if failed_only else "ended"
    noun = f"{n} {kind} job{'s' if n != 1 else ''}"
    if failed and not failed_only:
        noun += f" ({failed} failed)"
    return f"{noun} and {'its' if n == 1 else 'their'} logs ({config.format_size(size)})"


def _confirmed(question: str) -> bool:
    """Ask on the terminal; without one (a script, a pipe), refuse rather than guess: --yes says yes."""
    if not sys.stdin or not sys.stdin.isatty():
        raise UsageError(
            f"rm --ended would {question.removesuffix('? [y/N] ')}, and there is no terminal to confirm on",
            "add --yes to remove them without asking",
        )
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")

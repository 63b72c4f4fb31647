"""`jobwarden explain JOB` or `--group ID`: why a job died or is stuck, root cause first."""

from __future__ import annotations

import argparse
from typing import Any

from jobwarden import config
from jobwarden.cli.common import open_procfs, print_json, print_lines
from jobwarden.errors import UsageError

HELP = "why a job died or is stuck"


def add_arguments(explain: argparse.ArgumentParser) -> None:
    explain.add_argument("job", metavar="JOB", nargs="?", help="an id, a name (its newest job) or @last")
    explain.add_argument("--run", type=int, metavar="N", help="an earlier attempt (default: the last)")
    explain.add_argument("--group", metavar="ID", help="one verdict for every rank of a distributed job")
    explain.add_argument("--attempt", type=int, metavar="K", help="with --group: that attempt (default last)")
    explain.add_argument(
        "--exit-status",
        action="store_true",
        help="with --group: exit 0 if it succeeded, the requeue code if the cause is retryable, else 1",
    )
    explain.add_argument("--group-dir", metavar="DIR", help="with --group: where the ranks wrote the records")
    explain.add_argument(
        "--clock-tolerance",
        metavar="DUR",
        help="with --group: clocks closer than this tie (default 2s)",
    )
    explain.add_argument("--json", action="store_true", help="the findings as JSON, root cause first")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.clock import SystemClock
    from jobwarden.paths import home_dir
    from jobwarden.text import render

    if args.group is not None:
        return _explain_group(args)
    for example, name in _GROUP_ONLY.items():
        if getattr(args, name) not in (None, False):
            flag = example.split()[0]
            raise UsageError(
                f"explain {flag} goes with --group ID", f"e.g. jobwarden explain --group ID {example}"
            )
    if args.job is None:
        raise UsageError("explain needs a JOB (an id or a name), or --group ID")
    from jobwarden.control.changes import explained

    status = explained(home_dir(), open_procfs(), args.job, args.run)
    profiled = _newest_profile(status.job.id, status.run.n)
    if args.json:
        print_json({**status.explain_json(), "profile": profiled})
    else:
        print_lines(render.explain_report(status, SystemClock().wall()))
        if profiled is not None:  # what the job was doing when last profiled (on a speed finding too)
            from jobwarden.text.profile import profile_line

            print_lines(["", profile_line(profiled)])
    return 0


def _newest_profile(job_id: int, run: int) -> dict[str, Any] | None:
    from jobwarden.control.profile import newest_summary
    from jobwarden.paths import home_dir

    return newest_summary(home_dir(), job_id, run)


_GROUP_ONLY = {  # explain's flags of a group's verdict, as the user types them: the Namespace's names
    "--attempt 1": "attempt",
    "--exit-status": "exit_status",
    "--group-dir DIR": "group_dir",
    "--clock-tolerance 2s": "clock_tolerance",
}


def _explain_group(args: argparse.Namespace) -> int:
    from jobwarden.control.options import group_directory, group_id
    from jobwarden.control.views.group import SETTLE_S, group_view
    from jobwarden.paths import home_dir
    from jobwarden.text.group import group_report

    if args.job is not None:
        raise UsageError(
            "explain: give a JOB or --group ID, not both", "e.g. jobwarden explain --group exp-7"
        )
    if args.run is not None:
        raise UsageError("explain --run goes with a JOB, not --group", "e.g. jobwarden explain --group ID")
    if args.attempt is not None and args.attempt < 0:
        raise UsageError(f"bad --attempt {args.attempt}: an attempt is 0 or more", "e.g. --attempt 1")
    group_id(args.group)
    args.group_dir = group_directory(args.group_dir)
    tolerance = config.optional_duration(args.clock_tolerance, "--clock-tolerance")
    # --exit-status is asked once the job is over (after srun, in the batch script): a rank with no end
    # then is lost, once the shared file system has had a moment to show every node's last lines
    settle = SETTLE_S if args.exit_status else 0.0
    view = group_view(
        home_dir(), args.group, args.attempt, args.group_dir, tolerance, args.exit_status, settle
    )
    if args.json:
        print_json(view.to_json())
    else:
        print_lines(group_report(view))
    return view.exit_status() if args.exit_status else 0

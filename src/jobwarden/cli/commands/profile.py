"""`jobwarden profile JOB`: a sampled profile of a running job (py-spy), stored with the run."""

from __future__ import annotations

import argparse

from jobwarden.cli.common import open_procfs, print_json, print_lines

HELP = "a sampled profile of every process of a running job (py-spy), stored with the run"


def add_arguments(profile: argparse.ArgumentParser) -> None:
    profile.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    profile.add_argument("--duration", metavar="DUR", help="how long to sample (default 10s, at most 5m)")
    profile.add_argument(
        "--rate", metavar="HZ", help="samples per second (default: chosen from the job's thread count)"
    )
    profile.add_argument("--run", type=int, metavar="N", help=argparse.SUPPRESS)
    profile.add_argument("--trigger", choices=("cli", "auto"), default="cli", help=argparse.SUPPRESS)
    profile.add_argument("--json", action="store_true", help="the profile's summary and top list as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.profile import parse_profile_duration, parse_rate, profile_job
    from jobwarden.paths import home_dir
    from jobwarden.text.profile import profile_report

    duration = parse_profile_duration(args.duration)
    rate = parse_rate(args.rate)
    result = profile_job(
        home_dir(),
        open_procfs(),
        args.job,
        duration_s=duration,
        rate_hz=rate,
        run_n=args.run,
        trigger=args.trigger,
    )
    if args.json:
        print_json(result.to_json())
    else:
        print_lines(profile_report(result.summary, str(result.path) if result.path else None))
    return 0

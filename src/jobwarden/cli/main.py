"""Argument parsing and the one error funnel. Each subcommand has one handler in `handlers`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from jobwarden import __version__
from jobwarden.errors import JobwardenError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jobwarden", description="Run long jobs detached, contained, and never silently dead."
    )
    p.add_argument("--version", action="version", version=f"jobwarden {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="start a job (detached) and print its id")
    run.add_argument("--name", help="a name to refer to the job by (default: from the command)")
    run.add_argument("--cwd", default=".", help="working directory of the job")
    run.add_argument("--env", action="append", default=[], metavar="K=V", help="set an environment variable")
    run.add_argument("--timeout", metavar="DUR", help="stop the job after this long (e.g. 12h)")
    run.add_argument(
        "--grace", metavar="DUR", help="SIGTERM -> SIGKILL delay when ending the job (default 10s)"
    )
    run.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="stream the output (Ctrl-C stops following, never the job)",
    )
    run.add_argument(
        "-w",
        "--wait",
        action="store_true",
        help="wait for the end; exit with the job's status (128+N for signal N)",
    )
    run.add_argument(
        "--notify",
        metavar="URL",
        help="POST each event (failed, hung, restarted, succeeded) as JSON to this http(s) URL",
    )
    run.add_argument(
        "--on-event",
        metavar="CMD",
        help="run CMD through /bin/sh on each event, with the event as JSON on its stdin",
    )
    run.add_argument("--json", action="store_true")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")

    ps = sub.add_parser("ps", help="list jobs")
    ps.add_argument("-a", "--all", action="store_true", help="include ended jobs")
    ps.add_argument("--json", action="store_true")

    status = sub.add_parser("status", help="how a job is doing, or how it ended")
    status.add_argument("job", metavar="JOB")
    status.add_argument("--run", type=int, metavar="N")
    status.add_argument("--json", action="store_true")

    logs = sub.add_parser("logs", help="show a job's output")
    logs.add_argument("job", metavar="JOB")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("-n", "--lines", type=int, metavar="N", help="only the last N lines")
    logs.add_argument("--since", metavar="DUR", help="only output written in the last DUR (e.g. 10m)")
    logs.add_argument("--run", type=int, metavar="N", help="an earlier attempt")

    stop = sub.add_parser("stop", help="end a job and everything it started")
    stop.add_argument("job", metavar="JOB")
    stop.add_argument("--grace", metavar="DUR", help="SIGTERM -> SIGKILL delay (default: the job's, 10s)")
    stop.add_argument("--json", action="store_true")

    wait = sub.add_parser("wait", help="block until a job ends; exit with its status")
    wait.add_argument("job", metavar="JOB")
    wait.add_argument("--timeout", metavar="DUR")
    wait.add_argument("--json", action="store_true")

    adopt = sub.add_parser("adopt", help="supervise again a job whose supervisor died")
    adopt.add_argument("job", metavar="JOB")
    adopt.add_argument("--json", action="store_true")

    explain = sub.add_parser("explain", help="why a job died or is stuck")
    explain.add_argument("job", metavar="JOB")
    explain.add_argument("--run", type=int, metavar="N")
    explain.add_argument("--json", action="store_true")

    rm = sub.add_parser("rm", help="forget an ended job and delete its logs")
    rm.add_argument("job", metavar="JOB")

    orphans = sub.add_parser(
        "orphans", help="list processes that should not be alive: leftovers of ended jobs, stray GPU holders"
    )
    orphans.add_argument("--kill", action="store_true", help="end them (SIGTERM, grace, SIGKILL)")
    orphans.add_argument("--grace", metavar="DUR", help="with --kill: SIGTERM -> SIGKILL delay (default 10s)")
    orphans.add_argument("--json", action="store_true")

    doctor = sub.add_parser("doctor", help="check what jobwarden can do on this machine, and how to fix it")
    doctor.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="jobwarden: %(message)s",
    )
    from jobwarden.cli import handlers

    try:
        return handlers.HANDLERS[args.command](args)
    except JobwardenError as err:
        print(f"jobwarden: {err.message}", file=sys.stderr)
        if err.remedy:
            print(f"  {err.remedy}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141

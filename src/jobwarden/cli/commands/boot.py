"""`jobwarden boot enable|disable|status`: run `jobwarden resume` at every boot."""

from __future__ import annotations

import argparse

from jobwarden.cli.common import print_json

HELP = "run `jobwarden resume` at every boot: enable, disable or status"


def add_arguments(boot: argparse.ArgumentParser) -> None:
    boot.add_argument("action", choices=("enable", "disable", "status"), help="enable, disable or status")
    boot.add_argument(
        "--method",
        choices=("auto", "systemd", "cron"),
        default="auto",
        help="a systemd user unit, or a cron @reboot line (default auto: systemd where it runs)",
    )
    boot.add_argument("--json", action="store_true", help="what was written, as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.boot.startup import boot
    from jobwarden.paths import home_dir

    plan = boot(args.action, args.method, home_dir())
    if args.json:
        print_json(plan.to_json())
        return 0
    state = "enabled" if plan.enabled else "disabled"
    if args.action == "status":
        print(f"jobwarden resume at boot: {state} ({plan.method}: {plan.where})")
    else:
        done = "" if plan.changed else " already"
        print(f"jobwarden resume at boot:{done} {state} ({plan.method}: {plan.where})")
    for note in plan.notes:
        print(f"  note: {note}")
    return 0

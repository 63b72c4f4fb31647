"""`jobwarden queue [NAME] [--parallel N]`: show queues, or set how many runs of one run at once."""

from __future__ import annotations

import argparse

from jobwarden import config
from jobwarden.cli.common import print_json
from jobwarden.errors import UsageError

HELP = "show queues, or set how many runs of one run at once (--parallel)"


def add_arguments(queue: argparse.ArgumentParser) -> None:
    queue.add_argument("name", metavar="NAME", nargs="?", help="the queue (default: list every queue)")
    queue.add_argument("--parallel", metavar="N", help="let N runs of the queue run at once")
    queue.add_argument("--json", action="store_true", help="the queues as JSON")


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.options import queue_name
    from jobwarden.control.queues import queues as read_queues
    from jobwarden.paths import home_dir
    from jobwarden.text.sanitize import one_line

    name = queue_name(args.name) if args.name is not None else None
    if args.parallel is not None and name is None:
        raise UsageError("queue --parallel needs the queue's NAME", "e.g. jobwarden queue gpu --parallel 2")
    parallel = None
    if args.parallel is not None:
        parallel = config.parse_count(args.parallel, "--parallel")
        if parallel < 1:
            raise UsageError("bad --parallel '0': a queue runs 1 or more at once", "e.g. --parallel 2")
    queues = read_queues(home_dir(), name, parallel)
    if args.json:
        print_json([q.to_json() for q in queues] if name is None else queues[0].to_json())
        return 0
    if not queues:
        print("no queues (jobwarden run --queue NAME -- ... makes one)")
    for q in queues:
        print(f"{one_line(q.name)}: {q.running} of {q.parallel} running, {q.waiting} waiting")
    return 0

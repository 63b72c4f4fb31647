"""The everyday commands of issue 21, each loaded only by its own command: `rerun`, `rm --ended`, `queue`,
`resume`, `boot`, and what `run` says of a name shared by live jobs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobwarden import config
from jobwarden.clock import SystemClock
from jobwarden.errors import UsageError
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import home_dir
from jobwarden.store import Store


def _home() -> Path:
    return home_dir()


def _procfs() -> ProcFS:
    return ProcFS()


def _print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2))


def job_ids(home: Path, refs: list[str]) -> list[int]:
    """--after JOB...: each reference resolved now (a name or @last means the job it names now)."""
    with Store(home) as store:
        return [store.job(ref).id for ref in refs]


def note_namesakes(home: Path, ref: str) -> None:
    """A JOB given by a name that names more than one job not over yet: the newest is meant (Store.job),
    and the user is told, once, before the command acts on it."""
    from jobwarden.errors import JobwardenError

    try:
        with Store(home) as store:
            job = store.job(ref)
            older = [i for i in store.unfinished_namesakes(job.name, job.id) if i < job.id]
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


def warn_namesakes(name: str, older: Sequence[int]) -> None:
    """A name that older jobs, still not over, hold too: from now on it means the newest."""
    if older:
        ids = ", ".join(str(i) for i in older)
        print(
            f"jobwarden: note: {name!r} also names job{'s' if len(older) > 1 else ''} {ids}, not over yet; "
            f"{name!r} now means the newest, reach the older by id",
            file=sys.stderr,
        )


def rerun(args: argparse.Namespace) -> int:
    from jobwarden.control.rerun import rerun
    from jobwarden.text.sanitize import one_line

    launched, old = rerun(_home(), args.job)
    if not args.json:
        print(f"jobwarden: job {launched.id} reruns job {old.id} ({one_line(old.name)})", file=sys.stderr)
    from jobwarden.cli.handlers import launched_said

    return launched_said(launched, args.json, args.follow, args.wait, {"rerun_of": old.id})


def rm_ended(home: Path, procfs: ProcFS, args: argparse.Namespace) -> int:
    from jobwarden.control.cleanup import ended_jobs, remove_jobs

    if args.job is not None:
        raise UsageError("rm: give a JOB or --ended, not both", "e.g. jobwarden rm --ended --failed")
    older = config.optional_duration(args.older_than, "--older-than")
    with Store(home) as store:
        found = ended_jobs(
            store, procfs, failed_only=args.failed, older_than_s=older, now=SystemClock().wall()
        )
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
        remove_jobs(store, [job.id for job, _ in found.jobs])
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


def queue(args: argparse.Namespace) -> int:
    from jobwarden.control.options import queue_name
    from jobwarden.store import Store
    from jobwarden.text.sanitize import one_line

    name = queue_name(args.name) if args.name is not None else None
    if args.parallel is not None and name is None:
        raise UsageError("queue --parallel needs the queue's NAME", "e.g. jobwarden queue gpu --parallel 2")
    with Store(_home()) as store:
        if args.parallel is not None:
            parallel = config.parse_count(args.parallel, "--parallel")
            if parallel < 1:
                raise UsageError("bad --parallel '0': a queue runs 1 or more at once", "e.g. --parallel 2")
            assert name is not None
            store.set_queue_parallel(name, parallel)
        queues = [q for q in store.queues() if name is None or q.name == name]
    if name is not None and not queues:
        from jobwarden.store.queues import DEFAULT_PARALLEL, QueueInfo

        queues = [QueueInfo(name, DEFAULT_PARALLEL, 0, 0)]
    if args.json:
        _print_json([q.to_json() for q in queues] if name is None else queues[0].to_json())
        return 0
    if not queues:
        print("no queues (jobwarden run --queue NAME -- ... makes one)")
    for q in queues:
        print(f"{one_line(q.name)}: {q.running} of {q.parallel} running, {q.waiting} waiting")
    return 0


def resume(args: argparse.Namespace) -> int:
    from jobwarden.control.reboot import resume
    from jobwarden.text.sanitize import one_line

    done = resume(_home(), _procfs())
    if args.json:
        _print_json([r.to_json() for r in done])
    elif not done:
        print("no job was ended by a reboot")
    for r in [] if args.json else done:
        print(f"job {r.job_id} ({one_line(r.name)}), ended by the reboot in run {r.ended_run}: {r.why}")
    return 0


def boot(args: argparse.Namespace) -> int:
    from jobwarden.control.boot import boot

    plan = boot(args.action, args.method, _home())
    if args.json:
        _print_json(plan.to_json())
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

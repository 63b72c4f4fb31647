"""`jobwarden _runs CMD WORD...` (hidden): a job's run numbers, for a shell completion of --run."""

from __future__ import annotations

import argparse

from jobwarden.cli.commands.completion import RUN_OPTION

HELP = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("words", nargs=argparse.REMAINDER)


def handle(args: argparse.Namespace) -> int:
    for n in run_numbers(args.words):
        print(n)
    return 0


def run_numbers(words: list[str]) -> list[int]:
    """`jobwarden _runs CMD WORD...`: the run numbers of the job the words name (the words typed after
    the subcommand, a last `--run` or not); none when they name no job or one that does not exist."""
    from jobwarden.cli.parser import build_parser
    from jobwarden.control.jobs import run_numbers as numbers
    from jobwarden.errors import JobwardenError
    from jobwarden.paths import home_dir

    if not words:
        return []
    command, rest = words[0], [w for w in words[1:]]
    while rest and rest[-1] == RUN_OPTION:
        rest.pop()
    try:
        args, _ = build_parser(command).parse_known_args([command, *rest])
    except SystemExit:  # words argparse refuses (it said so on stderr, which the script drops)
        return []
    ref = getattr(args, "job", None)
    if isinstance(ref, list):
        ref = ref[0] if len(ref) == 1 else None
    if not isinstance(ref, str):
        return []
    try:
        return numbers(home_dir(), ref)
    except JobwardenError:
        return []

"""The parser of the whole CLI, built from the registry (`cli.commands`): for a known subcommand only that
subcommand's parser is built, and only its module imported (argparse looks up translations for every help
string, a few stat calls each, which adds up over twenty parsers; and `run` is on every job start's path).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobwarden import __version__
from jobwarden.cli.commands import COMMANDS, load
from jobwarden.text.term import terminal_width

if TYPE_CHECKING:
    from typing import Any


class _HelpFormatter(argparse.HelpFormatter):
    """argparse makes a formatter for every argument it adds (to check its metavar), and the default one
    imports shutil (~10 ms with the compression modules it pulls in) only to ask for the terminal width."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or terminal_width() - 2)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a mistyped command is answered with the nearest command, and never
    with the list of every choice (which names the hidden commands a completion uses)."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if isinstance(action, argparse._SubParsersAction) and value not in (action.choices or ()):
            raise UnknownCommand(str(value))  # not an ArgumentError: argparse would print its usage
        super()._check_value(action, value)


class UnknownCommand(Exception):
    def __init__(self, word: str) -> None:
        super().__init__(word)
        self.word = word


def public_commands() -> list[str]:
    return [name for name in COMMANDS if not name.startswith("_")]


def did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """'; did you mean X?' for the candidate nearest `word`, or '' when none is near."""
    from difflib import get_close_matches

    near = get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI; with `only` (a subcommand name), a parser that knows just that subcommand."""
    p = _Parser(
        prog="jobwarden",
        description="Run long jobs detached, contained, and never silently dead.",
        epilog="environment: JOBWARDEN_HOME is where jobs are kept (default ~/.local/state/jobwarden); "
        "JOBWARDEN_UTC=1 shows times in UTC; NO_COLOR=1 turns colours off. Defaults for run: "
        "~/.config/jobwarden/config.toml (jobwarden doctor shows the one in force).",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"jobwarden {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    p.add_argument(
        "--utc",
        action="store_true",
        help="show every time in UTC (default: local time with its offset; or set JOBWARDEN_UTC=1)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if only is None or only == name:
            command = load(name)
            help_text, add_arguments = command.HELP, command.add_arguments
            if help_text:
                parser = sub.add_parser(name, help=help_text, formatter_class=_HelpFormatter)
            else:  # no help: left out of the command list
                parser = sub.add_parser(name, formatter_class=_HelpFormatter)
            add_arguments(parser)
            if not name.startswith("_"):  # `jobwarden status 3 --utc` as well as `jobwarden --utc status 3`
                parser.add_argument(
                    "--utc", action="store_true", default=argparse.SUPPRESS, help="show times in UTC"
                )
    return p

"""The `jobwarden` command: parse (cli.parser), dispatch to the command's module (cli.commands), and the
one error funnel. Each subcommand is one module, `cli/commands/<verb>.py`, with its arguments and handler.

`run` sits on the latency budget of every job start, so this module imports only what parsing needs:
nothing for -v but `trace`, and for a known subcommand only that subcommand's module and parser.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from jobwarden import trace
from jobwarden.cli.commands import COMMANDS, load
from jobwarden.cli.parser import UnknownCommand, build_parser, did_you_mean, public_commands
from jobwarden.errors import JobwardenError

__all__ = ["build_parser", "console_entry", "main", "public_commands"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = argv[0] if argv else None
    args = _parse(build_parser(first if first in COMMANDS else None), argv)
    if args is None:
        return 2
    trace.set_level(args.verbose)
    if args.utc:
        from jobwarden.clock import UTC_ENV, show_utc

        show_utc(True)
        os.environ[UTC_ENV] = "1"  # and in what this command starts: a shim writes times in findings
    else:
        from jobwarden import clock

        clock.default_utc = _config_utc
    from jobwarden.cli.common import note_namesakes

    try:
        handle: Callable[[argparse.Namespace], int] = load(args.command).handle  # imported by the parse
        note_namesakes(args)  # a JOB given by a name that older live jobs share: said first
        return handle(args)
    except JobwardenError as err:  # a message may quote a job's name, command or output: sanitised
        from jobwarden.text.sanitize import terminal_text

        print(f"jobwarden: {terminal_text(err.message)}", file=sys.stderr)
        if err.remedy:
            print(f"  {terminal_text(err.remedy)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141
    except Exception as err:  # a bug of ours: one clear line, the traceback only when asked for
        return _internal_error(err)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    """The arguments, or None once an unknown option was reported: named with the nearest option of its
    command, and nothing run (`run --hang-timout 5m -- CMD` must not start CMD without its timeout)."""
    try:
        args, unknown = parser.parse_known_args(argv)
    except UnknownCommand as err:
        from jobwarden.text.sanitize import terminal_text  # its patterns: only on the way to an error

        hint = did_you_mean(err.word, public_commands())
        print(f"jobwarden: unknown command {terminal_text(repr(err.word))}{hint}", file=sys.stderr)
        print("  jobwarden --help lists the commands", file=sys.stderr)
        return None
    if not unknown:
        return args
    from jobwarden.text.sanitize import terminal_text

    command = getattr(args, "command", None)
    sub = _subparser(parser, command) or parser
    options = [o for action in sub._actions for o in action.option_strings if o.startswith("--")]
    word = next((u for u in unknown if u.startswith("-")), unknown[0])
    what = (
        f"unknown option {word.split('=', 1)[0]}" if word.startswith("-") else f"unexpected argument {word}"
    )
    where = f"jobwarden {command}" if command else "jobwarden"
    hint = did_you_mean(word.split("=", 1)[0], options) if word.startswith("--") else ""
    print(f"{where}: {terminal_text(what)}{hint}", file=sys.stderr)
    print(f"  {where} --help lists its options", file=sys.stderr)
    return None


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    return None


def _config_utc() -> bool:
    """The config file's `[display] utc`, read once the first time is shown."""
    from jobwarden.control.configfile import display_utc

    return display_utc()


def _internal_error(err: Exception) -> int:
    from jobwarden.text.sanitize import one_line

    print(f"jobwarden: internal error: {type(err).__name__}: {one_line(str(err))}", file=sys.stderr)
    if trace.enabled(2):
        import traceback

        traceback.print_exc()
    else:
        print("  a bug in jobwarden: rerun with -vv for its traceback, and report it", file=sys.stderr)
    return 70  # EX_SOFTWARE


def console_entry() -> None:
    """The `jobwarden` command and `python -m jobwarden`: main(), then an immediate exit. Tearing the
    interpreter down (every module and object, one by one) takes 10-15 ms after the work is done, and
    `run` waits for nothing so long. Nothing is lost: every store handle is closed when main() returns,
    the CLI starts no threads that outlive a command, and the streams are flushed here."""
    try:
        code = main()
    except KeyboardInterrupt:  # a Ctrl-C while the interpreter was still loading jobwarden
        code = 130
    try:
        if sys.stdout is not None:  # None when started with fd 1 closed
            sys.stdout.flush()
    except BrokenPipeError:  # `jobwarden ps | head -1`
        code = code or 141
    except OSError as err:  # `jobwarden ps > file` on a full disk
        code = code or 1
        with contextlib.suppress(OSError, AttributeError):
            print(f"jobwarden: cannot write the output: {err.strerror}", file=sys.stderr)
    with contextlib.suppress(OSError, AttributeError):
        sys.stderr.flush()
    os._exit(code)

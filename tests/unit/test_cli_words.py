"""The CLI's words (issue 21): every option of every command says what it does in `--help`."""

from __future__ import annotations

import argparse

from jobwarden.cli.main import build_parser


def every_action() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    found = [("jobwarden", action) for action in parser._actions]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if not name.startswith("_"):  # hidden helpers of the completion
                    found += [(name, a) for a in sub._actions]
    return found


def test_every_option_and_argument_of_every_command_has_help() -> None:
    missing = [
        f"{command} {'/'.join(action.option_strings) or action.dest}"
        for command, action in every_action()
        if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_every_help_text_is_one_clause_without_a_final_period() -> None:
    texts = [action.help for _, action in every_action() if action.help and action.help != argparse.SUPPRESS]
    assert [t for t in texts if t.endswith(".") or "\n" in t] == []

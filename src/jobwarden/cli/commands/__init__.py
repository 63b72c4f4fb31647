"""The commands: one module each (`cli/commands/<verb>.py`), holding its help (`HELP`), its arguments
(`add_arguments(parser)`) and its handler (`handle(args) -> exit status`). This registry names them, in
the order `jobwarden --help` lists them; a name that starts with `_` is a hidden command (a shell
completion's helper), never listed.

A module is imported only when its command is parsed or run (`load`): `run` sits on the latency budget of
every job start, and must not pay for the imports of the other commands. Building the whole parser
(`jobwarden --help`, `completion`) loads them all, so a module imports at its top only what its arguments
need, and its handler the rest.
"""

from __future__ import annotations

import importlib
from types import ModuleType

COMMANDS: dict[str, str] = {  # the command -> its module in this package
    "run": "run",
    "ps": "ps",
    "status": "status",
    "logs": "logs",
    "stop": "stop",
    "wait": "wait",
    "adopt": "adopt",
    "explain": "explain",
    "metrics": "metrics",
    "dump": "dump",
    "profile": "profile",
    "rm": "rm",
    "orphans": "orphans",
    "doctor": "doctor",
    "health": "health",
    "completion": "completion",
    "_jobs": "jobs_to_complete",  # hidden: the ids and names a completion offers
    "_runs": "runs_to_complete",  # hidden: a job's run numbers, for a completion of --run
    "top": "top",
    "web": "web",
    # everyday habits (issue 21)
    "rerun": "rerun",
    "queue": "queue",
    "resume": "resume",
    "boot": "boot",
    "diff": "diff",
}


def load(command: str) -> ModuleType:
    """The module of `command` (one of COMMANDS), imported now if it was not yet."""
    return importlib.import_module(f"{__name__}.{COMMANDS[command]}")

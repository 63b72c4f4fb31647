"""`jobwarden top`'s entry: check what the terminal UI needs before starting it.

Imported by the CLI's `top` handler only, so no other command loads textual. Without textual it says
how to install it; without a terminal (stdout a pipe or a file, cron) it prints the job list once, as
`ps` would, and says why."""

from __future__ import annotations

import sys
from pathlib import Path

from jobwarden import config
from jobwarden.errors import JobwardenError, UsageError

MIN_INTERVAL_S = 0.1  # each refresh reads the whole store: faster would only load the machine


def parse_interval(text: str) -> float:
    try:
        interval = config.parse_duration(text)
    except UsageError as err:
        raise UsageError(f"--interval: {err.message}", err.remedy) from None
    if interval < MIN_INTERVAL_S:
        remedy = f"at least {MIN_INTERVAL_S:g}s; the default is 2s"
        raise UsageError(f"--interval: {text!r} is too short", remedy)
    return interval


def textual_importable() -> bool:
    try:
        import textual.app  # noqa: F401 - a broken install fails here, not inside the running UI
    except ImportError:
        return False
    return True


def top(home: Path, interval_text: str, include_ended: bool, read_only: bool) -> int:
    interval = parse_interval(interval_text)
    if not textual_importable():
        from jobwarden.paths import install_extra_command

        raise JobwardenError(
            "jobwarden top needs the textual library, which is not installed", install_extra_command("tui")
        )
    # textual reads keys from stdin and draws on stderr; stdout is where a redirected `top` is looked for
    if not all(stream.isatty() for stream in (sys.stdin, sys.stdout, sys.stderr)):
        _print_list_once(home, include_ended)
        return 0
    from jobwarden.tui.app import TopApp

    TopApp(home, interval, include_ended, read_only).run()
    return 0


def _print_list_once(home: Path, include_ended: bool) -> None:
    from jobwarden.clock import SystemClock
    from jobwarden.control.views.joblist import views_of
    from jobwarden.osapi.procfs import ProcFS
    from jobwarden.text.render import ps_table
    from jobwarden.text.term import for_terminal

    views = views_of(home, ProcFS(), include_ended=include_ended)
    for line in for_terminal(ps_table(views, SystemClock().wall())):
        print(line)
    print(
        "jobwarden top: not a terminal, so the job list was printed once (as `jobwarden ps`)", file=sys.stderr
    )

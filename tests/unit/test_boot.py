"""`jobwarden boot` (control.boot.startup): the method chosen, the systemd unit's quoting, and the crontab
edit. The crontab is the user's own file, read and written through the `crontab` command: here an in-memory
stand-in of that command takes its place (a test must never edit a real user's crontab)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.control.boot.startup import (
    CRON_MARK,
    BootCommand,
    Crontab,
    boot,
    choose_method,
    cron_line,
    unit_text,
    with_cron_line,
)
from jobwarden.errors import UsageError

COMMAND = BootCommand(
    {"JOBWARDEN_HOME": "/home/u/jw home", "PATH": "/opt/x:/usr/bin"},
    ["/venv/bin/python", "-m", "jobwarden", "resume"],
)


def test_systemd_where_it_is_pid_1_else_cron(tmp_path: Path) -> None:
    assert choose_method("auto", tmp_path) == "systemd"  # /run/systemd/system exists
    assert choose_method("auto", tmp_path / "missing") == "cron"
    assert choose_method("cron", tmp_path) == "cron"


def test_the_unit_quotes_what_systemd_would_expand() -> None:
    odd = BootCommand(
        {"JOBWARDEN_HOME": "/home/u/100%/a b", "PATH": "/bin"}, ["/opt/$HOME/py", "-m", "jobwarden"]
    )
    text = unit_text(odd)
    assert 'Environment="JOBWARDEN_HOME=/home/u/100%%/a b"\n' in text  # % is a specifier; a space quotes
    assert 'ExecStart="/opt/$$HOME/py" -m jobwarden\n' in text  # $ is a variable in ExecStart


def test_the_cron_line_sets_the_home_and_path_and_is_marked() -> None:
    line = cron_line(COMMAND, Path("/home/u/jw home/resume.log"))
    assert line == (
        "@reboot JOBWARDEN_HOME='/home/u/jw home' PATH=/opt/x:/usr/bin /venv/bin/python -m jobwarden resume "
        f">> '/home/u/jw home/resume.log' 2>&1 {CRON_MARK}"
    )
    assert "%" not in cron_line(BootCommand({"A": "1"}, ["x"]), Path("/l"))
    assert "\\%" in cron_line(BootCommand({"A": "50%"}, ["x"]), Path("/l"))  # cron reads % as a newline


_LINES = st.lists(
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=40).filter(
        lambda row: not row.rstrip().endswith(CRON_MARK)
    ),
    max_size=8,
)


@given(_LINES)
def test_enabling_keeps_every_other_line_and_is_idempotent(rows: list[str]) -> None:
    crontab = "".join(f"{row}\n" for row in rows)
    ours = cron_line(COMMAND, Path("/l"))
    once = with_cron_line(crontab, ours)
    assert once.splitlines() == [*rows, ours]
    assert with_cron_line(once, ours) == once
    assert with_cron_line(once, None).splitlines() == rows


class MemoryCrontab:
    """Stands in for `crontab -l` / `crontab FILE`: the text and every install."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.installs: list[str] = []

    def as_crontab(self) -> Crontab:
        def install(text: str) -> None:
            self.installs.append(text)
            self.text = text

        return Crontab(lambda: self.text, install)


def test_cron_enable_then_disable_touch_only_our_line(tmp_path: Path) -> None:
    tab = MemoryCrontab("MAILTO=me\n0 3 * * * backup\n")
    plan = boot("enable", "cron", tmp_path, {"PATH": "/usr/bin"}, tab.as_crontab())
    assert plan.method == "cron" and plan.enabled and plan.changed
    rows = tab.text.splitlines()
    assert rows[:2] == ["MAILTO=me", "0 3 * * * backup"] and rows[2].endswith(CRON_MARK)
    assert f"JOBWARDEN_HOME={tmp_path} " in rows[2] and f">> {tmp_path}/resume.log 2>&1" in rows[2]
    again = boot("enable", "cron", tmp_path, {"PATH": "/usr/bin"}, tab.as_crontab())
    assert not again.changed and len(tab.installs) == 1  # nothing rewritten
    assert boot("status", "cron", tmp_path, {}, tab.as_crontab()).enabled
    off = boot("disable", "cron", tmp_path, {}, tab.as_crontab())
    assert off.changed and not off.enabled and tab.text == "MAILTO=me\n0 3 * * * backup\n"
    assert not boot("disable", "cron", tmp_path, {}, tab.as_crontab()).changed
    assert not boot("status", "cron", tmp_path, {}, tab.as_crontab()).enabled


@pytest.mark.parametrize("method", ["cron", "systemd"])
@pytest.mark.parametrize("bad", ["\n", "\r", "\x0b", "\x85"])
def test_a_control_character_in_the_home_is_refused_and_nothing_written(
    tmp_path: Path, method: str, bad: str
) -> None:
    """A newline in JOBWARDEN_HOME wrote a line of its own into the unit (`ExecStartPre=...`) and into the
    cron line (shlex.quote keeps newlines): refused, naming JOBWARDEN_HOME, before anything is written."""
    home = tmp_path / f"jw{bad}ExecStartPre=/bin/touch /tmp/pwned"
    tab = MemoryCrontab("")
    environ = {"PATH": "/usr/bin", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    with pytest.raises(UsageError, match="JOBWARDEN_HOME holds a control character"):
        boot("enable", method, home, environ, tab.as_crontab())
    assert tab.installs == [] and not (tmp_path / "config").exists()


def test_a_control_character_in_path_is_refused() -> None:
    tab = MemoryCrontab("")
    with pytest.raises(UsageError, match="PATH holds a control character"):
        boot("enable", "cron", Path("/h"), {"PATH": "/usr/bin\n* * * * * evil"}, tab.as_crontab())
    assert tab.installs == []

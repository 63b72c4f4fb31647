"""`jobwarden boot enable|disable|status`: run `jobwarden resume` at every boot (pm2's `startup`).

Where systemd runs (it is PID 1: /run/systemd/system exists), a systemd user unit: the file
`$XDG_CONFIG_HOME/systemd/user/jobwarden-resume.service` and its link in `default.target.wants/`, which is
all `systemctl --user enable` makes. A user's manager starts at boot only with linger on (`loginctl
enable-linger`); `enable` says so when it is off. Elsewhere, a cron `@reboot` line in the user's crontab,
marked so that `disable` finds it. Both are idempotent: enabling twice writes the same, disabling what is
not there changes nothing.

The command recorded is this interpreter with `-m jobwarden` (a virtual environment's), the home in force
(JOBWARDEN_HOME), and this shell's PATH: at boot no login shell has set one, and the jobs started again
resolve their commands on it.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from jobwarden.errors import JobwardenError, UsageError

UNIT_NAME = "jobwarden-resume.service"
RESUME_LOG = "resume.log"  # under the home: what `resume` said at boot, from cron (systemd's journal has it)
CRON_MARK = "# jobwarden boot: resume the jobs a reboot ended"
SYSTEMD_RUNNING = Path("/run/systemd/system")  # sd_booted(3): systemd is PID 1 when this exists
LINGER_DIR = Path("/var/lib/systemd/linger")


class BootPlan(NamedTuple):
    """What `boot` did or would do, for the report and --json."""

    method: str  # systemd | cron
    enabled: bool
    where: str  # the unit's path, or "crontab"
    changed: bool
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "method": self.method,
            "enabled": self.enabled,
            "where": self.where,
            "changed": self.changed,
            "notes": list(self.notes),
        }


class BootCommand(NamedTuple):
    """What runs at boot: `argv` with `env` set (the home in force, and this shell's PATH)."""

    env: dict[str, str]
    argv: list[str]


def resume_command(home: Path, environ: Mapping[str, str]) -> BootCommand:
    """The command boot runs; refused before anything is written when a value holds a control character:
    a newline ends a unit's line (the rest a directive of its own: `ExecStartPre=...`) and a cron line
    (shlex.quote keeps it), so it could run a command the user never asked for."""
    env = {"JOBWARDEN_HOME": str(home), "PATH": environ.get("PATH") or os.defpath}
    for name, value in env.items():
        _refuse_control_characters(name, value)
    _refuse_control_characters("the Python interpreter's path", sys.executable)
    return BootCommand(env, [sys.executable, "-m", "jobwarden", "resume"])


def _refuse_control_characters(name: str, value: str) -> None:
    bad = next((c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
    if bad is not None:
        raise UsageError(
            f"boot: {name} holds a control character ({bad!r}), which would break the boot entry's line "
            "and could run a command of its own; nothing was written",
            f"use a {name} without control characters (newlines, tabs...)",
        )


def choose_method(method: str, systemd_marker: Path = SYSTEMD_RUNNING) -> str:
    if method != "auto":
        return method
    return "systemd" if systemd_marker.is_dir() else "cron"


# --- systemd ------------------------------------------------------------------------------------------


def unit_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(base) / "systemd" / "user"


def unit_text(command: BootCommand) -> str:
    """The user unit. Its command line is quoted as systemd reads it (systemd.service(5), "Command
    lines": double quotes, C escapes; `%` and `$` doubled, or systemd would expand them)."""
    environment = "".join(
        f"Environment={_systemd_word(f'{k}={v}', dollar=False)}\n" for k, v in command.env.items()
    )
    return (
        "# Written by `jobwarden boot enable`; `jobwarden boot disable` removes it.\n"
        "[Unit]\n"
        "Description=jobwarden: mark the jobs a reboot ended, start again those with --restart\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"{environment}"
        f"ExecStart={' '.join(_systemd_word(arg) for arg in command.argv)}\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def _systemd_word(text: str, dollar: bool = True) -> str:
    quoted = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if dollar:  # ExecStart expands $VAR; Environment= does not
        quoted = quoted.replace("$", "$$")
    return f'"{quoted}"' if quoted != text or any(c.isspace() for c in text) or not text else text


def enable_systemd(environ: Mapping[str, str], command: BootCommand, user: str) -> BootPlan:
    directory = unit_dir(environ)
    unit, link = directory / UNIT_NAME, directory / "default.target.wants" / UNIT_NAME
    text = unit_text(command)
    changed = _read(unit) != text
    if changed:
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(unit, text, 0o644)
    if not (link.is_symlink() and os.readlink(link) == str(unit)):
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(unit)
        changed = True
    notes = []
    if not (LINGER_DIR / user).exists():
        notes.append(
            f"linger is off for {user}: the unit runs when your user manager starts, at your first login "
            f"rather than at boot; to run it at boot: sudo loginctl enable-linger {user}"
        )
    return BootPlan("systemd", True, str(unit), changed, tuple(notes))


def disable_systemd(environ: Mapping[str, str]) -> BootPlan:
    directory = unit_dir(environ)
    unit, link = directory / UNIT_NAME, directory / "default.target.wants" / UNIT_NAME
    changed = False
    for path in (link, unit):
        if path.is_symlink() or path.exists():
            path.unlink()
            changed = True
    return BootPlan("systemd", False, str(unit), changed)


def systemd_status(environ: Mapping[str, str]) -> BootPlan:
    directory = unit_dir(environ)
    unit, link = directory / UNIT_NAME, directory / "default.target.wants" / UNIT_NAME
    return BootPlan("systemd", unit.exists() and link.is_symlink(), str(unit), False)


# --- cron ---------------------------------------------------------------------------------------------


def cron_line(command: BootCommand, log: Path) -> str:
    """The @reboot line: `VAR=value ... command >> log 2>&1`. cron hands it to /bin/sh, and reads an
    unescaped % as a newline."""
    assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in command.env.items())
    line = f"{assigned} {shlex.join(command.argv)} >> {shlex.quote(str(log))} 2>&1"
    return f"@reboot {line.replace('%', chr(92) + '%')} {CRON_MARK}"


def with_cron_line(crontab: str, line: str | None) -> str:
    """The crontab with our line replaced by `line` (None: removed); every other line kept as it was."""
    kept = [row for row in crontab.splitlines() if not row.rstrip().endswith(CRON_MARK)]
    if line is not None:
        kept.append(line)
    return "".join(f"{row}\n" for row in kept)


class Crontab(NamedTuple):
    """The user's crontab through the `crontab` command: read it (empty when there is none), install one."""

    read: Callable[[], str]
    install: Callable[[str], None]


def system_crontab() -> Crontab:
    import shutil
    import tempfile

    from jobwarden.osapi.tool import ToolUnavailable, run_tool

    binary = shutil.which("crontab")
    if binary is None:
        raise JobwardenError(
            "no systemd here and no crontab command: nothing can run `jobwarden resume` at boot",
            "install cron (sudo apt-get install cron), or run `jobwarden resume` from your own boot script",
        )

    def read() -> str:
        result = run_tool([binary, "-l"], 30)
        if result.returncode == 0:
            return result.stdout.decode("utf-8", "replace")
        if b"no crontab" in result.stderr.lower():
            return ""
        raise JobwardenError(f"crontab -l failed: {result.stderr.decode('utf-8', 'replace').strip()}")

    def install(text: str) -> None:
        with tempfile.NamedTemporaryFile("w", prefix="jobwarden-crontab-", suffix=".txt") as fh:
            fh.write(text)
            fh.flush()
            try:
                result = run_tool([binary, fh.name], 30)
            except ToolUnavailable as err:
                raise JobwardenError(err.message) from None
        if result.returncode != 0:
            raise JobwardenError(f"crontab failed: {result.stderr.decode('utf-8', 'replace').strip()}")

    return Crontab(read, install)


def enable_cron(crontab: Crontab, command: BootCommand, log: Path) -> BootPlan:
    before = crontab.read()
    after = with_cron_line(before, cron_line(command, log))
    if after != before:
        crontab.install(after)
    return BootPlan("cron", True, "crontab", after != before)


def disable_cron(crontab: Crontab) -> BootPlan:
    before = crontab.read()
    after = with_cron_line(before, None)
    if after != before:
        crontab.install(after)
    return BootPlan("cron", False, "crontab", after != before)


def cron_status(crontab: Crontab) -> BootPlan:
    enabled = any(row.rstrip().endswith(CRON_MARK) for row in crontab.read().splitlines())
    return BootPlan("cron", enabled, "crontab", False)


# --- the command --------------------------------------------------------------------------------------


def boot(
    action: str,
    method: str,
    home: Path,
    environ: Mapping[str, str] | None = None,
    crontab: Crontab | None = None,
    systemd_marker: Path = SYSTEMD_RUNNING,
) -> BootPlan:
    """`boot enable|disable|status`, by the method chosen (`auto`: systemd where it runs, else cron)."""
    env = os.environ if environ is None else environ
    chosen = choose_method(method, systemd_marker)
    if action not in ("enable", "disable", "status"):
        raise UsageError(f"boot: unknown action {action!r}", "use enable, disable or status")
    if chosen == "systemd":
        if action == "enable":
            import pwd

            plan = enable_systemd(env, resume_command(home, env), pwd.getpwuid(os.geteuid()).pw_name)
            return plan._replace(notes=(*plan.notes, *_reload_user_manager()))
        if action == "disable":
            return disable_systemd(env)._replace(notes=_reload_user_manager())
        return systemd_status(env)
    tab = crontab or system_crontab()
    if action == "enable":
        return enable_cron(tab, resume_command(home, env), home / RESUME_LOG)
    return disable_cron(tab) if action == "disable" else cron_status(tab)


def _reload_user_manager() -> tuple[str, ...]:
    """Tell a running user manager that its units changed; none running (no login session, a container)
    is no error: it reads them as it starts."""
    import shutil

    from jobwarden.osapi.tool import ToolUnavailable, run_tool

    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return ()
    try:
        result = run_tool([systemctl, "--user", "daemon-reload"], 30)
    except ToolUnavailable:
        return ()
    if result.returncode == 0:
        return ()
    return ("no user manager answered `systemctl --user daemon-reload`: it reads the unit when it starts",)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write_atomic(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)

"""The user's defaults for `run`: `$XDG_CONFIG_HOME/jobwarden/config.toml` (~/.config/jobwarden/...).

    [run]                      # keys are run's long options with `_`; a flag given to `run` wins
    hang_timeout = "30m"
    notify = "https://hooks.slack.com/services/..."
    restart = "on-failure"
    log_max = "4G"

    [web]
    url = "http://gpu-box:8765"   # the job page's address in notifications: <url>/jobs/<id>

    [display]
    utc = true                    # every command shows times in UTC, as `jobwarden --utc` does

The file costs `run` one stat() when there is none: tomllib is imported only when there is a file to
read. A value is checked by the code that checks the flag, and a bad one is an error naming the file, the
line and the key. The file can run commands (`on_event`), so one that another user may write is refused,
as ssh refuses such a config.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from jobwarden import trace
from jobwarden.errors import UsageError
from jobwarden.paths import config_file

MAX_CONFIG_BYTES = 1 << 20  # a config is a few lines; a larger file is not one

# [run]'s keys: run's long options with `_`, and what a value may be. `str`: text checked as the flag's
# text is; `count`: a whole number or its text; `duration`: seconds as a number, or text ("30m"); `list`:
# a string or a list of strings (a repeatable flag)
RUN_KEYS: dict[str, str] = {
    "timeout": "duration",
    "grace": "duration",
    "hang_timeout": "duration",
    "on_hang": "str",
    "restart": "str",
    "max_restarts": "count",
    "restart_delay": "duration",
    "mem_limit": "str",
    "notify": "str",
    "on_event": "str",
    "mp_start": "str",
    "no_py_hooks": "bool",
    "log_max": "str",
    "keep_running": "list",
    "queue": "str",
}
WEB_KEYS: dict[str, str] = {"url": "str"}
DISPLAY_KEYS: dict[str, str] = {"utc": "bool"}
TABLES = {"run": RUN_KEYS, "web": WEB_KEYS, "display": DISPLAY_KEYS}
CHOICES = {"on_hang": ("dump", "stop", "restart"), "mp_start": ("spawn", "forkserver")}
# keys that are one setting together: a flag given for one of them sets the group, the file none of it
# (`run --restart no` with `max_restarts = 5` in the file means no restart, not a contradiction)
LINKED = (("restart", "max_restarts"),)


def run_defaults(given: set[str]) -> tuple[dict[str, Any], str | None]:
    """`run`'s defaults from the file in force, for the flags not `given`, and its [web] url."""
    user = load_config()
    if user is None:
        return {}, None
    values = defaults_for(user, given)
    trace.info(f"defaults from {user.path}: {', '.join(sorted(values)) or 'none'}")
    return values, user.web_url


def defaults_for(user: UserConfig, given: set[str]) -> dict[str, Any]:
    """The file's [run] values for the flags not `given` (their keys), a linked group left whole to
    whichever says any of it."""
    skip = set(given)
    for group in LINKED:
        if skip & set(group):
            skip |= set(group)
    return {key: value for key, value in user.run.items() if key not in skip}


class UserConfig(NamedTuple):
    """What the file in force says: `run` holds run's defaults as the flags would give them (text, a
    list of texts for a repeatable flag, True for a flag without a value)."""

    path: Path
    run: dict[str, Any]
    web_url: str | None = None
    utc: bool = False  # [display] utc

    def shown(self) -> list[str]:
        """`key = value` for `doctor`, URLs cut to their host: a webhook's path is its secret."""
        shown = [f"{key} = {_redacted(key, value)}" for key, value in sorted(self.run.items())]
        if self.web_url:
            shown.append(f"[web] url = {self.web_url}")
        if self.utc:
            shown.append("[display] utc = true")
        return shown


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    return config_file(environ)


def load_config(environ: Mapping[str, str] | None = None) -> UserConfig | None:
    """The config file in force, checked whole; None when there is none."""
    path = config_path(environ)
    try:
        # O_NONBLOCK: opening a FIFO planted at the path would wait for a writer forever; the file's type
        # is checked (fstat) before anything is read, and a regular file ignores the flag
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None  # the common case: nothing more is loaded
    except OSError as err:
        raise _error(path, None, None, f"cannot read it: {err.strerror}") from err
    try:
        text = _read_checked(fd, path)
    finally:
        os.close(fd)
    return parse_config(text, path)


def _read_checked(fd: int, path: Path) -> str:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _error(path, None, None, f"not a regular file (a {_file_type(st.st_mode)})")
    if st.st_uid not in (os.geteuid(), 0):
        raise _error(path, None, None, f"it belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise _error(
            path,
            None,
            None,
            f"other users may write it (mode {st.st_mode & 0o777:04o}), and it can run commands (on_event)",
            f"chmod go-w {path}",
        )
    if st.st_size > MAX_CONFIG_BYTES:
        raise _error(path, None, None, f"{st.st_size} bytes: too large for a config file")
    data = os.read(fd, MAX_CONFIG_BYTES + 1)
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise _error(path, None, None, f"not UTF-8 text (byte {err.start})") from None


def _file_type(mode: int) -> str:
    kinds = {stat.S_IFDIR: "directory", stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "device"}
    return kinds.get(stat.S_IFMT(mode), "device" if stat.S_ISBLK(mode) else "special file")


def parse_config(text: str, path: Path) -> UserConfig:
    """The file's text, checked: TOML, known tables and keys, each value as its flag would take it."""
    import tomllib  # only when there is a file

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise _error(path, None, None, f"not valid TOML: {err}") from None
    for table, value in data.items():
        if table not in TABLES or not isinstance(value, dict):
            known = ", ".join(f"[{t}]" for t in TABLES)
            line = _line_of(text, None, table) or _table_line(text, table)
            raise _error(
                path,
                line,
                table,
                f"unknown {'table' if isinstance(value, dict) else 'key'}",
                f"a config holds {known}",
            )
    run = {key: _run_value(text, path, key, value) for key, value in data.get("run", {}).items()}
    web = data.get("web", {})
    for key in web:
        if key not in WEB_KEYS:
            raise _error(path, _line_of(text, "web", key), f"web.{key}", "unknown key", "[web] holds url")
    url = web.get("url")
    if url is not None:
        url = _web_url(text, path, url)
    display = data.get("display", {})
    for key, value in display.items():
        if key not in DISPLAY_KEYS:
            raise _error(
                path, _line_of(text, "display", key), f"display.{key}", "unknown key", "[display] holds utc"
            )
        if not isinstance(value, bool):
            raise _error(path, _line_of(text, "display", key), f"display.{key}", "not true or false")
    return UserConfig(path, run, url, bool(display.get("utc", False)))


def display_utc() -> bool:
    """Whether the config file in force says `[display] utc = true` (read when a time is first shown)."""
    if not os.path.lexists(config_file()):
        return False
    user = load_config()
    return bool(user and user.utc)


def _run_value(text: str, path: Path, key: str, value: object) -> Any:
    line = _line_of(text, "run", key)
    kind = RUN_KEYS.get(key)
    if kind is None:
        dashed = key.replace("_", "-")
        raise _error(
            path,
            line,
            key,
            "unknown key",
            f"[run] keys are run's long options with '_' (--{dashed}?)"
            if key.replace("-", "_") not in RUN_KEYS
            else f"write it with '_': {key.replace('-', '_')}",
        )
    try:
        flag_value = _as_flag(kind, value)
    except ValueError as err:
        raise _error(path, line, key, str(err)) from None
    try:
        check_run_value(key, flag_value)
    except UsageError as err:  # said of the key, not of the flag: "hang_timeout: bad duration 'ten'"
        message = err.message.removeprefix(f"--{key.replace('_', '-')}: ")
        raise _error(path, line, key, message, err.remedy) from None
    return flag_value


def _as_flag(kind: str, value: object) -> Any:
    """A TOML value as `run`'s flag would give it."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value
    if kind == "list":
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{value!r} is not a string or a list of strings")
        return list(values)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{value!r} is not a {'number or ' if kind != 'str' else ''}string")
    if kind == "str" and not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string (quote it)")
    if kind == "count" and isinstance(value, float):
        raise ValueError(f"{value!r} is not a whole number")
    return str(value)


def check_run_value(key: str, value: Any) -> None:
    """The check `run` makes of the flag the key is named after (control.options), so a file and a flag
    are refused alike."""
    from jobwarden.control.options import run_options

    if key in CHOICES and value not in CHOICES[key]:
        raise UsageError(f"bad value {value!r}", f"use one of: {', '.join(CHOICES[key])}")
    if key not in ("no_py_hooks", "on_hang", "mp_start"):
        run_options(**{key: value})


def _web_url(text: str, path: Path, url: object) -> str:
    import urllib.parse

    line = _line_of(text, "web", "url")
    parsed = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise _error(
            path, line, "web.url", f"{url!r} is not an http(s) URL", 'e.g. url = "http://gpu-box:8765"'
        )
    if parsed.query or "token" in parsed.path:
        raise _error(
            path,
            line,
            "web.url",
            "the address must not carry the token (it would go out in every notification)",
            "give the address alone; the browser keeps the token as a cookie",
        )
    return str(url).rstrip("/")


def _redacted(key: str, value: object) -> str:
    if key == "notify" and isinstance(value, str):
        from jobwarden.joboptions import redact

        return redact(value)
    return repr(value) if not isinstance(value, str) else value


def _line_of(text: str, table: str | None, key: str) -> int | None:
    """The line (from 1) where `key` is set in `[table]` (None: at the top, before any table)."""
    current: str | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("["):
            current = line.strip("[]").strip().strip('"')
            continue
        name = line.partition("=")[0].strip().strip('"').strip("'")
        if "=" in line and current == table and name == key:
            return n
        if "=" in line and table is not None and name == f"{table}.{key}" and current is None:
            return n
    return None


def _table_line(text: str, table: str) -> int | None:
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.strip().strip("[]").strip().strip('"') == table and raw.strip().startswith("["):
            return n
    return None


def _error(path: Path, line: int | None, key: str | None, what: str, remedy: str = "") -> UsageError:
    where = f"{path}" + (f" line {line}" if line else "") + (f": {key}" if key else "")
    return UsageError(
        f"config file {where}: {what}", remedy or f"fix it, or move it aside: mv {path} {path}.off"
    )

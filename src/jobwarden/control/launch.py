"""`jobwarden run`: check the command, record the job, start its shim, return once the pid is known."""

from __future__ import annotations

import dataclasses
import os
import shutil
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.clock import SystemClock
from jobwarden.errors import CommandNotExecutable, CommandNotFound, UsageError
from jobwarden.model import JobSpec, JobState
from jobwarden.store import Store

_INTERPRETERS = {"python", "python3", "bash", "sh", "zsh", "node", "ruby", "perl", "uv", "torchrun"}


@dataclass(frozen=True)
class Launched:
    id: int
    name: str
    run: int
    pid: int | None
    state: str
    shim_pid: int
    exit_code: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "pid": self.pid, "state": self.state}


def resolve_command(argv: list[str], cwd: str, env: dict[str, str]) -> str:
    """Fail at once, before anything is recorded or started, for a command that cannot run."""
    if not argv:
        raise UsageError("no command given", "put it after --, e.g. jobwarden run -- python train.py")
    program = argv[0]
    if "/" in program:
        path = Path(cwd, program)
        if not path.exists():
            raise CommandNotFound(f"command not found: {program}", f"no such file (relative to {cwd})")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise CommandNotExecutable(
                f"not executable: {program}", f"chmod +x {program}, or run it through its interpreter"
            )
        return str(path)
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise CommandNotFound(
            f"command not found: {program}",
            "check the spelling and PATH "
            "(jobwarden runs it without a shell; use sh -c '...' for shell syntax)",
        )
    return found


def default_name(argv: list[str]) -> str:
    """`python train.py --lr 3` -> 'train.py'; `./run.sh` -> 'run.sh'."""
    first = os.path.basename(argv[0])
    if first.rstrip("0123456789.") in _INTERPRETERS:
        args = iter(argv[1:])
        for arg in args:
            if arg == "-c":
                break
            if arg == "-m":
                return next(args, first)[:40]
            if not arg.startswith("-"):
                return os.path.basename(arg)[:40] or first
    return first[:40]


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"bad --env {pair.split('=')[0]!r}", "use --env KEY=VALUE")
        env[key] = value
    return env


def notify_options(url: str | None, command: str | None) -> dict[str, Any]:
    """The job options of `--notify URL` and `--on-event CMD` (read by the shim), checked up front."""
    options: dict[str, Any] = {}
    if url is not None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UsageError(
                f"--notify {url.split('?')[0]!r}: not an http(s) URL",
                "give the full address, e.g. --notify https://hooks.slack.com/services/...",
            )
        options["notify"] = url
    if command is not None:
        if not command.strip():
            raise UsageError(
                "--on-event needs a command", "e.g. --on-event 'notify-send jobwarden \"$(cat)\"'"
            )
        options["on_event"] = command
    return options


def launch(home: Path, spec: JobSpec, options: dict[str, Any]) -> Launched:
    from jobwarden.control.shimproc import start_shim

    cwd = os.path.abspath(spec.cwd)
    if not os.path.isdir(cwd):
        raise UsageError(f"--cwd {spec.cwd}: no such directory")
    resolve_command(list(spec.command), cwd, {**os.environ, **spec.env})
    spec = dataclasses.replace(spec, cwd=cwd)
    with Store(home) as store:
        job_id, run = store.create_job(spec, options, SystemClock().wall(), JobState.STARTING)
    shim_pid, report = start_shim(home, job_id, run, "launch")
    if "error" in report:
        code = int(report.get("exit_code", 1))
        error_cls = CommandNotFound if code == 127 else CommandNotExecutable if code == 126 else UsageError
        raise error_cls(f"job {job_id} could not start: {report['error']}")
    return Launched(job_id, spec.name, run, report.get("pid"), report.get("state", "running"), shim_pid)

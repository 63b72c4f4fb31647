"""The facts `jobwarden doctor` judges and the verdict of one check: plain data, shared by the checks
(control.doctor.checks, control.doctor.container) and by what gathers the facts (control.doctor.hostfacts), so
that none of them imports another for its types."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class Tool:
    path: str
    version: str | None


@dataclass(frozen=True)
class Interpreter:
    path: str
    version: tuple[int, int, int] | None
    source: str  # "PATH" or "pyenv"


@dataclass(frozen=True)
class StoreFacts:
    database: Path
    exists: bool
    integrity: str | None = None  # "ok" or the first problem PRAGMA integrity_check reports
    schema: int | None = None
    latest: int = 0
    error: str | None = None  # it could not be opened at all


@dataclass(frozen=True)
class ConfigFacts:
    """The config file in force (control.configfile): where, and what it sets or why it is refused."""

    path: Path
    exists: bool
    settings: tuple[str, ...] = ()  # "key = value", webhook URLs cut to their host
    error: str | None = None


@dataclass(frozen=True)
class HostFacts:
    euid: int
    yama_scope: int | None
    cap_sys_ptrace: bool
    ptrace_attach: tuple[bool | None, str]
    pyspy: Tool | None
    gdb: Tool | None
    cgroup_disabled: bool
    containment: str | None  # what `run` would use: "cgroup-v1 /sys/fs/cgroup/memory/..." or None
    nvml: tuple[str, str, str]  # ("ok" | "no-module" | "unavailable", what was found, the fix)
    nvidia_driver: bool
    kernel: tuple[int, int]
    kernel_release: str
    pidfd_exit: tuple[bool | None, str]
    proc_events: tuple[bool, str]  # can the shim read the kernel's process events, or why not
    proc_events_disabled: bool  # JOBWARDEN_PROC_EVENTS=off
    interpreters: tuple[Interpreter, ...]
    store: StoreFacts
    home: Path
    home_mode: int | None  # None: the home does not exist yet
    home_uid: int | None
    free_bytes: int | None
    database_fs: str | None = None  # the home's file system type
    database_moved: bool = False  # the home is on a network file system: the database is on local disk
    config: ConfigFacts | None = None
    # in a container (control.doctor.container): what says so; empty on a host
    container: tuple[str, ...] = ()
    pid1: str | None = None  # the command of PID 1 of our pid namespace
    pid_namespace: bool = False  # not the host's pid namespace (no kernel process events there)
    # the cgroup jobwarden runs in, when it counts OOM kills: "cgroup-v1 /sys/fs/cgroup/memory", its limit
    enclosing_oom: tuple[str, int | None] | None = None
    kernel_log: str | None = None  # why the kernel log cannot be read; None: it can

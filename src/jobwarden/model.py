"""Plain data shared by every layer: job states, records, and the process identity. Stdlib only.

Records on the paths of `jobwarden run` and `ps` (here, in store.records, in the modules the shim loads
before it answers `run`, and in the views `ps` builds) are NamedTuples, not dataclasses: importing
`dataclasses` (it loads `inspect`) costs each such command about 15 ms, and each dataclass about 0.8 ms
more, against 0.1-0.5 ms for a NamedTuple class.
"""

from __future__ import annotations

import enum
import time
from typing import Any, NamedTuple


class JobState(enum.StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def is_active(self) -> bool:
        """A shim is (or should be) watching the run."""
        return self in ACTIVE_STATES

    @property
    def is_ended(self) -> bool:
        return self in ENDED_STATES


ACTIVE_STATES = frozenset(
    {JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.STOPPING, JobState.RESTARTING}
)
ENDED_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
# not over yet: watched by a shim, or lost (its shim died; its processes may still run, and adopt resumes it)
UNFINISHED_STATES = ACTIVE_STATES | {JobState.LOST}


class EndReason(enum.StrEnum):
    """Why a run ended, as the shim saw it; the state alone cannot tell a timeout from a crash."""

    EXITED = "exited"
    SIGNALLED = "signalled"
    STOPPED = "stopped"
    TIMEOUT = "timeout"
    SPAWN_FAILED = "spawn-failed"
    HUNG = "hung"  # ended by --on-hang stop|restart after the stacks were stored
    MEM_LIMIT = "mem-limit"  # ended by jobwarden's memory watchdog (no cgroup could enforce --mem-limit)
    SUPERVISOR_FAILED = "supervisor-failed"  # its shim ended before it started the command
    ENGINE_STOP = "engine-stop"  # ended by the engine it runs in (scancel, time limit, `ray job stop`)
    DEPENDENCY_FAILED = "dependency-failed"  # never started: a job it was to run after (--after) failed
    REBOOT = "reboot"  # the machine rebooted while it ran (a new boot id): every process of it died then
    UNKNOWN = "unknown"


class ProcessId(NamedTuple):
    """A process is (pid, start time), never a pid alone: pids are reused (pid_max may be 32768)."""

    pid: int
    start_time: int  # clock ticks since boot, field 22 of /proc/PID/stat


class Ranks(NamedTuple):
    """A process's place in a distributed job, from the variables its launcher set (model.ranks_from): its
    global rank, and LOCAL_RANK / GROUP_RANK where given. None where unknown."""

    rank: int | None
    local_rank: int | None = None
    group_rank: int | None = None

    def __str__(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"local rank {self.local_rank}" if self.local_rank is not None else f"group {self.group_rank}"

    def to_json(self) -> dict[str, int | None]:
        return {"rank": self.rank, "local_rank": self.local_rank, "group_rank": self.group_rank}


# Every launcher's way of telling a process its rank (shim.tree.jobtree reads these from /proc/PID/environ,
# the hooks from os.environ): torchrun, torch's env:// and most trainers (RANK); Lightning and torchrun
# (LOCAL_RANK with NODE_RANK / GROUP_RANK and LOCAL_WORLD_SIZE); Open MPI, MPICH / Intel MPI, PMIx;
# Slurm's srun (SLURM_PROCID: the task's rank, inherited by everything the task starts).
GLOBAL_RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
RANK_VARIABLES = (*GLOBAL_RANK_VARIABLES, "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


def ranks_from(values: dict[str, str]) -> Ranks | None:
    """Ranks from the launchers' variables (a process's environment); None when it has none of them.
    The first global rank variable set wins (a torchrun rank under srun has both RANK and SLURM_PROCID:
    RANK is its own). Without one, LOCAL_RANK is the global rank on the first node (its node rank, from
    GROUP_RANK or NODE_RANK, 0 or unset: Lightning's children carry only LOCAL_RANK and NODE_RANK), and
    node * LOCAL_WORLD_SIZE + LOCAL_RANK beyond it."""
    local = _decimal(values.get("LOCAL_RANK"))
    node = _decimal(values.get("GROUP_RANK"))
    if node is None:
        node = _decimal(values.get("NODE_RANK"))
    rank = next((r for r in map(_decimal, map(values.get, GLOBAL_RANK_VARIABLES)) if r is not None), None)
    if rank is None and local is not None:
        per_node = _decimal(values.get("LOCAL_WORLD_SIZE"))
        if not node:
            rank = local
        elif per_node:
            rank = node * per_node + local
    if rank is None and local is None and node is None:
        return None
    return Ranks(rank, local, node)


def _decimal(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


class ProcessEnd(NamedTuple):
    """A process of the job that ended, as the shim records it. `at` is the moment of death where the kernel's
    process events or the reaping parent told it, else when the shim noticed; `start_time` is 0 for a
    process that died before anything could read its /proc entry."""

    pid: int
    start_time: int
    status: int | None  # the wait status; None: unknown
    at: float
    ppid: int | None = None
    cmdline: str = ""
    ranks: Ranks | None = None


class ProcessSnapshot(NamedTuple):
    """One process of a job as seen at one moment."""

    pid: int
    ppid: int
    start_time: int
    state: str
    cmdline: str
    rss_bytes: int
    cpu_percent: float | None
    uid: int | None = None
    gpu_memory_bytes: int | None = None
    ranks: Ranks | None = None  # what torchrun & co. told the process it is (its RANK, LOCAL_RANK...)


class Survivor(NamedTuple):
    """A process that outlived a stop, and why it could not be ended."""

    pid: int
    cmdline: str
    reason: str


class JobSpec(NamedTuple):
    """What the user asked to run. The environment is kept out of repr: it often carries tokens. Being a
    tuple, a spec iterated, `_asdict()`-ed or passed to json.dumps carries `env` along: name the fields."""

    command: tuple[str, ...]
    cwd: str
    name: str
    env: dict[str, str] = {}  # noqa: RUF012 - never mutated; replaced whole with _replace
    timeout_s: float | None = None
    grace_s: float = 10.0

    def __repr__(self) -> str:
        return f"JobSpec(command={self.command!r}, cwd={self.cwd!r}, name={self.name!r})"


class Finding(NamedTuple):
    rule: str
    title: str
    summary: str
    severity: str  # "critical" | "error" | "warning" | "info"
    evidence: tuple[str, ...] = ()
    remedy: str = ""
    pids: tuple[int, ...] = ()  # the process the finding is about first
    rank: int | None = None  # that process's rank, when it is a rank of a distributed job
    # A finding has a life: `at` when it became true (for a hang, when the job went quiet), where known;
    # `resolved_at` when it stopped being true (the process resumed, output came back): None while current
    at: float | None = None
    resolved_at: float | None = None

    @property
    def current(self) -> bool:
        return self.resolved_at is None

    def to_json(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "title": self.title,
            "summary": self.summary,
            "severity": self.severity,
            "evidence": list(self.evidence),
            "remedy": self.remedy,
            "pids": list(self.pids),
            "rank": self.rank,
            "at": _iso(self.at),
            "resolved_at": _iso(self.resolved_at),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finding:
        """The finding's body as stored (its moments are the store's columns, not read from here)."""
        return cls(
            str(d["rule"]),
            str(d["title"]),
            str(d["summary"]),
            str(d["severity"]),
            tuple(d.get("evidence", ())),
            str(d.get("remedy", "")),
            tuple(int(p) for p in d.get("pids", ())),
            d.get("rank") if isinstance(d.get("rank"), int) else None,
        )


def _iso(ts: float | None) -> str | None:
    """clock.iso, which model may not import (stdlib only): ISO 8601 in UTC, milliseconds; None where the
    time is absurd (outside years 1-9999: gmtime would raise)."""
    if ts is None or not -62_135_596_800.0 <= ts <= 253_402_300_799.0:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


# The finding rules, root cause first (rules.verdict says why in this order). Kept here, not in rules:
# `ps` ranks the stored findings of the jobs it lists, and importing the rules would cost it ~50 ms.
ROOT_CAUSE_ORDER = (
    "oom-kill",
    "cuda-oom",
    "pool-worker-lost",
    "dataloader-worker-killed",
    "process-stopped",
    "uninterruptible-io",
    "fork-deadlock",
    "collective-hang",
    "wait-chain",
    "no-progress",
    "stopped-by-user",
    "cancelled-by-engine",
    "machine-rebooted",
    "dependency-failed",
    "timeout",
    "python-exception",
    "native-crash",
    "terminal-hangup",
    "broken-pipe",
    "killed-externally",
    "exit-code",
    "gpu-idle",
    "disk-full",
    "notify-failed",
    "orphans-left",
    "supervisor-lost",
)
_RANKS = {rule: i for i, rule in enumerate(ROOT_CAUSE_ORDER)}
# A running job with a current finding of these is hung: `ps` shows it so, `ps --state hung` lists it. The
# rules whose finding lasts as long as the hang (rules.table.ENDS_WITH_THE_HANG, a test keeps them equal),
# named here for the reason above.
HUNG_RULES = frozenset(
    {"no-progress", "fork-deadlock", "collective-hang", "uninterruptible-io", "wait-chain"}
)


def root_cause_rank(rule: str) -> int:
    """A rule's place in the root-cause-first order; rules outside it (strays) come last."""
    return _RANKS.get(rule, len(ROOT_CAUSE_ORDER))

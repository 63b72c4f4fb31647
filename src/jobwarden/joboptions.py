"""What `run` was asked for beyond the command, as one typed record: parsed once (control.options), stored
as versioned JSON in the job's row, read by the shim and the rules by name.

Version 1 adds the "version" key. A job stored before it (a plain dict of whatever flags were given) reads
the same: a missing key takes its default, an unknown one is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from jobwarden.config import DEFAULT_GRACE_S, DEFAULT_LOG_MAX_BYTES, DEFAULT_MAX_RESTARTS

VERSION = 1


class JobOptions(NamedTuple):
    timeout_s: float | None = None  # --timeout
    grace_s: float = DEFAULT_GRACE_S  # --grace: SIGTERM -> SIGKILL
    hang_timeout_s: float | None = None  # --hang-timeout: None the default window, 0 off
    on_hang: str = "dump"  # dump | stop | restart
    py_hooks: bool = True  # --no-py-hooks turns it off
    mp_start: str | None = None  # --mp-start spawn | forkserver
    restart: str = "no"  # no | on-failure | always
    max_restarts: int = DEFAULT_MAX_RESTARTS  # also the budget of --on-hang restart; config.UNLIMITED: no cap
    restart_delay_s: float | None = None  # the backoff's base; None: the default
    mem_limit_bytes: int | None = None
    gpus: int | None = None  # --gpus N
    gpu_ids: tuple[int, ...] | None = None  # --gpu-ids I,J
    notify: str | None = None  # --notify URL
    on_event: str | None = None  # --on-event CMD
    # Inside an engine (Slurm, Ray, a container): `run` stays attached as the engine's task (docs/cluster.md)
    engine: str | None = None  # "slurm" | "ray" | "container"; None: a run on its own, detached
    # the engine's kill budget: Slurm's KillWait, Ray's stop wait, a container's stop timeout
    engine_budget_s: float | None = None
    group: str | None = None  # --group: the distributed job this run is a part of
    group_dir: str | None = None  # --group-dir: the group's shared records (default: under the home)
    rank: int | None = None  # --rank: this run's rank in the group (None: one per process, from RANK)
    node: str | None = None  # the node this run is on, as the engine names it
    attempt: int = 0  # the engine's attempt at the whole job (Slurm's SLURM_RESTART_COUNT)
    requeue_exit: int | None = None  # --requeue-exit: the exit code that asks the engine to requeue
    max_requeues: int | None = None  # --max-requeues: no requeue code from this attempt on
    # False inside Slurm, attached or --detach: a memory cgroup of ours nested in Slurm's task cgroup
    # would hide an OOM from Slurm (FAILED instead of OUT_OF_MEMORY); False for a container's entrypoint:
    # the container's own cgroup is the one whose limit and counters count
    own_cgroup: bool = True
    # Everyday habits (issue 21)
    log_max_bytes: int | None = None  # --log-max: the most output.log may hold on disk; None: the default
    keep_running: tuple[str, ...] = ()  # --keep-running PATTERN: processes left running at the run's end
    after: tuple[int, ...] = ()  # --after JOB: job ids that must succeed before this one starts
    queue: str | None = None  # --queue NAME: wait for a place in this queue
    web_url: str | None = None  # the config file's [web] url: the job page's address in notifications

    @property
    def log_cap_bytes(self) -> int:
        """The cap on output.log on disk (--log-max, else the default); 0: none (--log-max off)."""
        return DEFAULT_LOG_MAX_BYTES if self.log_max_bytes is None else self.log_max_bytes

    @property
    def wants_gpus(self) -> bool:
        return bool(self.gpus or self.gpu_ids)

    def to_json(self) -> dict[str, Any]:
        stored = self._asdict()
        stored["gpu_ids"] = list(self.gpu_ids) if self.gpu_ids is not None else None
        stored["keep_running"] = list(self.keep_running)
        stored["after"] = list(self.after)
        return {"version": VERSION, **stored}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> JobOptions:
        known = {k: v for k, v in stored.items() if k in cls._fields and v is not None}
        if "gpu_ids" in known:
            known["gpu_ids"] = tuple(int(i) for i in known["gpu_ids"])
        if "keep_running" in known:
            known["keep_running"] = tuple(str(p) for p in known["keep_running"])
        if "after" in known:
            known["after"] = tuple(int(i) for i in known["after"])
        if not known.get("grace_s"):  # 0 was never stored for "no grace": it meant the default
            known.pop("grace_s", None)
        return cls(**known)


# --- a --notify URL as it may be shown ---------------------------------------------------------------


def redact(url: str) -> str:
    """scheme://host/… : a webhook's path is its secret (Slack, Discord, Teams), never log it."""
    import urllib.parse  # only where a webhook is shown: never on `run`'s path

    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/…"

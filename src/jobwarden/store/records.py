"""Rows of the store as NamedTuples (cheap to define: see jobwarden.model)."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from jobwarden.joboptions import JobOptions
from jobwarden.model import JobState, Ranks, Survivor

if TYPE_CHECKING:  # diagnosis types: not on the `run` path
    from jobwarden.observations import ProcessStack


class JobRecord(NamedTuple):
    """A job as stored. Like JobSpec, its `env` is never shown: name the fields, never dump the tuple."""

    id: int
    name: str
    command: tuple[str, ...]
    cwd: str
    created_at: float
    options: JobOptions
    env: dict[str, str]  # never shown (see __repr__): it may hold tokens
    rerun_of: int | None = None  # `jobwarden rerun`: the job this one repeats

    def __repr__(self) -> str:
        return f"JobRecord(id={self.id!r}, name={self.name!r}, command={self.command!r}, cwd={self.cwd!r})"

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        return cls(
            id=row["id"],
            name=row["name"],
            command=tuple(json.loads(row["command"])),
            cwd=os.fsdecode(row["cwd"]),  # bytes where it is not UTF-8 (store.jobs._path_value)
            created_at=row["created_at"],
            options=JobOptions.from_json(json.loads(row["options"])),
            env=json.loads(row["env"]),
            rerun_of=row["rerun_of"],
        )


class JobSummary(NamedTuple):
    """What a list of jobs shows of each (`ps`, the web's list, /metrics): its options and --env are
    neither read nor decoded, which is most of the cost of a long history."""

    id: int
    name: str
    command: tuple[str, ...]
    created_at: float


class RunRecord(NamedTuple):
    job_id: int
    n: int
    state: JobState
    shim_pid: int | None
    shim_start: int | None
    pid: int | None
    pid_start: int | None
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: str | None
    wait_status: int | None
    end_reason: str | None
    error: str | None
    stop_requested_at: float | None
    stop_grace: float | None
    containment: str | None
    orphans_left: list[dict[str, Any]]
    survivors: list[Survivor]
    queued_reason: str | None = None
    gpu_ids: tuple[int, ...] = ()
    mem_peak_bytes: int | None = None
    verdict_rule: str | None = None  # an ended run's first finding (its root cause), as the shim stored it
    verdict_title: str | None = None
    boot_id: str | None = None  # the boot its shim ran in: under another boot id, a reboot ended it
    kept: tuple[dict[str, Any], ...] = ()  # --keep-running: {pid, start_time, cmdline} left running

    @property
    def exit_status(self) -> int:
        """The shell-style status of the run: its exit code, or 128+N for signal N. Never 0 for a failed
        run: a job that exits 0 from its SIGTERM handler after jobwarden ended it as hung, timed out or
        over its --mem-limit has failed, and a container's restart policy must see that."""
        import signal

        if self.signal:
            try:
                return 128 + int(signal.Signals[self.signal])
            except KeyError:
                return 1
        if self.exit_code is not None:
            return 1 if self.exit_code == 0 and self.state == JobState.FAILED else self.exit_code
        return 0 if self.state == JobState.SUCCEEDED else 1

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> RunRecord:
        return cls(
            job_id=row["job_id"],
            n=row["n"],
            state=JobState(row["state"]),
            shim_pid=row["shim_pid"],
            shim_start=row["shim_start"],
            pid=row["pid"],
            pid_start=row["pid_start"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            exit_code=row["exit_code"],
            signal=row["signal"],
            wait_status=row["wait_status"],
            end_reason=row["end_reason"],
            error=row["error"],
            stop_requested_at=row["stop_requested_at"],
            stop_grace=row["stop_grace"],
            containment=row["containment"],
            orphans_left=_json_list(row["orphans_left"]),
            survivors=[Survivor(**s) for s in _json_list(row["survivors"])],
            queued_reason=row["queued_reason"],
            gpu_ids=tuple(_json_list(row["gpu_ids"])),
            mem_peak_bytes=row["mem_peak_bytes"],
            verdict_rule=row["verdict_rule"],
            verdict_title=row["verdict_title"],
            boot_id=row["boot_id"],
            kept=tuple(_json_list(row["kept"])),
        )


def restart_never_made(run: RunRecord, event_kinds: Sequence[str]) -> bool:
    """A lost run that never started: its supervisor died while it waited out the backoff before this
    restart (`restarting`, then `supervisor-lost`, and no process between). Nothing of it ran, and
    `jobwarden adopt` makes the restart (control.lifecycle)."""
    if run.state != JobState.LOST or run.pid is not None or run.started_at is not None:
        return False
    return "restarting" in event_kinds and "started" not in event_kinds


def _json_list(text: str | None) -> list[Any]:
    """A JSON list column; most runs hold none (NULL or "[]"), and a list of 10,000 runs skips the parser."""
    return decode_json(text) if text and text != "[]" else []


decode_json = json.JSONDecoder().decode  # json.loads, less a layer of argument checks: it adds up over a list


_STATES = {state.value: state for state in JobState}  # a dict lookup: JobState(text) costs 10x more
_STATE, _ORPHANS, _SURVIVORS, _GPU_IDS, _KEPT = (
    RunRecord._fields.index(name) for name in ("state", "orphans_left", "survivors", "gpu_ids", "kept")
)


def run_from_values(values: Sequence[Any]) -> RunRecord:
    """A run from its columns in RunRecord's field order (a list's SELECT names them so): by position,
    which over 10,000 runs costs a third of looking each column up by name."""
    fields = list(values[: len(RunRecord._fields)])
    fields[_STATE] = _STATES[fields[_STATE]]
    fields[_ORPHANS] = _json_list(fields[_ORPHANS])
    fields[_SURVIVORS] = [Survivor(**s) for s in _json_list(fields[_SURVIVORS])]
    fields[_GPU_IDS] = tuple(_json_list(fields[_GPU_IDS]))
    kept = fields[_KEPT]
    fields[_KEPT] = tuple(decode_json(kept)) if kept and kept != "[]" else ()  # NULL in almost every run
    return RunRecord._make(fields)


class ProcessRecord(NamedTuple):
    pid: int
    start_time: int
    ppid: int | None
    cmdline: str
    state: str | None
    rss_bytes: int | None
    cpu_percent: float | None
    first_seen: float
    ended_at: float | None
    wait_status: int | None
    gpu_memory_bytes: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    group_rank: int | None = None

    @property
    def ranks(self) -> Ranks | None:
        if self.rank is None and self.local_rank is None and self.group_rank is None:
            return None
        return Ranks(self.rank, self.local_rank, self.group_rank)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> ProcessRecord:
        return cls(**{k: row[k] for k in row.keys() if k not in ("job_id", "run")})  # noqa: SIM118 - a Row iterates values


class Event(NamedTuple):
    at: float
    run: int | None
    kind: str
    data: dict[str, Any]


class StackDump(NamedTuple):
    """Stacks of every process of a run at one moment: from `dump`, or captured by the hang watchdog."""

    at: float
    trigger: str
    stacks: tuple[ProcessStack, ...]

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> StackDump:
        from jobwarden.observations import ProcessStack

        return cls(
            row["at"], row["trigger"], tuple(ProcessStack.from_json(s) for s in json.loads(row["body"]))
        )

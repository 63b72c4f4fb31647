"""Everything the rules may look at for one run, gathered by the shim (live) or the explainer (after the
end). Plain data: the rules stay pure and their tests feed recorded evidence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobwarden.model import ProcessEnd
from jobwarden.observations import (
    FeedSite,
    ForkRecord,
    ForkRequest,
    GpuDevice,
    GpuProcess,
    LockSite,
    OomEvidence,
    ProcessDeath,
    ProcessFacts,
    ProcessStack,
    RankRecorder,
    UncaughtException,
    Wait,
    WaitParty,
)
from jobwarden.osapi.process import WaitStatus


@dataclass(frozen=True)
class RunEvidence:
    state: str
    exit_code: int | None
    signal: str | None
    end_reason: str | None
    pid: int | None  # the main process
    error: str | None = None
    job_id: int | None = None  # what a remedy's command names (`jobwarden dump 12`), never "JOB"
    mp_start: str | None = None  # the run's --mp-start: a remedy never asks for what is already in force
    engine_job: str | None = None  # the engine's id of the job (Slurm's job id), for its own commands
    timeout_s: float | None = None
    orphans_left: Sequence[dict[str, Any]] = ()
    survivors: Sequence[dict[str, Any]] = ()
    log_tail: Sequence[str] = ()
    events: Sequence[str] = ()  # event kinds, oldest first
    disk_full: Sequence[str] = ()  # the folders whose disk filled up during the run (disk-full events)
    stopping_at: float | None = None  # when jobwarden began to end the run (stop, --timeout, a hang...)
    # --- inside an engine (Slurm, Ray): its stop signal as the shim recorded it, and its word on why ---
    engine: str | None = None  # "slurm" | "ray"
    engine_budget_s: float | None = None  # its kill budget (Slurm's KillWait, Ray's stop wait)
    engine_signal: str | None = None  # "SIGTERM": the signal that stopped the run
    engine_signal_at: float | None = None
    engine_state: str | None = None  # Slurm's job state then: CANCELLED, TIMEOUT, PREEMPTED...
    engine_reason: str | None = None  # Slurm's Reason=
    stack_triggers: Sequence[str] = ()  # why each stored dump was taken: "hang", "dump", "engine-stop"...
    exceptions: Sequence[UncaughtException] = ()  # uncaught, per Python process, as the hooks recorded them
    # exceptions the processes formatted without dying of them: a worker's error on its way to its parent
    caught: Sequence[UncaughtException] = ()
    # the last stack stored of each process (a dump, a hang): what a worker was doing before it died
    last_stacks: Mapping[int, ProcessStack] = field(default_factory=dict)
    # --- diagnosis: filled where known ---
    now: float | None = None
    hang_window_s: float | None = None  # set when the watchdog judges the run hung (no progress for it)
    quiet_for_s: float | None = None  # seconds since the last sign of progress
    last_progress: str | None = None  # what that sign was: "output", "heartbeat", "cpu", "io", "gpu", "step"
    step_note: str | None = None  # where the job's step counter stands, when it shows one (progress)
    processes: Sequence[ProcessFacts] = ()  # live when judged
    deaths: Sequence[ProcessDeath] = ()  # processes of the run that ended, the main one included
    stacks: Sequence[ProcessStack] = ()  # the latest stacks of the live processes
    waits: Sequence[Wait] = ()  # what each blocked thread waits for, when hung (probes.waits)
    wait_parties: Mapping[int, WaitParty] = field(default_factory=dict)  # who those waits lead to
    # the `with` statements around the hung stacks' lines (probes.withlocks), by (file, line)
    lock_sites: Mapping[tuple[str, int], LockSite] = field(default_factory=dict)
    # what each idle thread waits on (a queue, an event...) and who feeds it (probes.feeds), by (file, line)
    feed_sites: Mapping[tuple[str, int], FeedSite] = field(default_factory=dict)
    recorders: Sequence[RankRecorder] = ()  # each rank's PyTorch flight recorder, read on a hang
    forks: Sequence[ForkRecord] = ()
    fork_requests: Sequence[ForkRequest] = ()  # explicit get_context("fork") / set_start_method("fork")
    oom: OomEvidence | None = None
    mem_limit_bytes: int | None = None
    gpus: Sequence[GpuDevice] = ()
    gpu_processes: Sequence[GpuProcess] = ()  # of this job's processes
    gpu_idle_for_s: float | None = None  # the job held GPU memory at ~0% utilisation this long
    gpu_idle_window_s: float | None = None  # how long it may last before gpu-idle (else hang_window_s)


def job_ref(ev: RunEvidence) -> str:
    """How a remedy's command names this job: its id (`jobwarden dump 12`)."""
    return str(ev.job_id) if ev.job_id is not None else "JOB"


def death_of(end: ProcessEnd, is_main: bool) -> ProcessDeath:
    """How a process ended, as the rules read it: its wait status decoded (an unknown status leaves both
    the exit code and the signal None)."""
    decoded = WaitStatus.decode(end.status) if end.status is not None and end.status >= 0 else None
    return ProcessDeath(
        pid=end.pid,
        ppid=end.ppid,
        cmdline=end.cmdline,
        at=end.at,
        exit_code=decoded.exit_code if decoded else None,
        signal=decoded.signal_name if decoded else None,
        is_main=is_main,
        rank=end.ranks.rank if end.ranks else None,
    )

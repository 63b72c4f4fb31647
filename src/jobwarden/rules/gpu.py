"""GPU findings: `gpu-idle` (a job holds GPU memory and computes nothing) and `stray-gpu-process` (GPU memory
held by a process that belongs to no live job: the S5 incident, 5.5 GiB held for 1.5 days by an orphan).

`gpu-idle` is part of `explain` (it judges one run). Strays are judged machine-wide, so they have their own
entry point, `stray_gpu_findings`, fed by the probe that lists GPU processes and resolves their owners.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobwarden.config import format_duration, format_size
from jobwarden.model import Finding
from jobwarden.observations import GpuDevice, GpuProcess
from jobwarden.rules.evidence import RunEvidence, job_ref
from jobwarden.rules.lookup import describe

_IDLE_UTILISATION = 5.0  # percent: below this a GPU counts as idle in the device line


# --- gpu-idle ---------------------------------------------------------------------------------------


def gpu_idle(ev: RunEvidence) -> Finding | None:
    window = ev.gpu_idle_window_s if ev.gpu_idle_window_s is not None else ev.hang_window_s
    if window is None or ev.gpu_idle_for_s is None or ev.gpu_idle_for_s < window:
        return None
    held = [p for p in ev.gpu_processes if p.used_bytes is None or p.used_bytes > 0]
    if not held:
        return None
    by_gpu: dict[int, list[GpuProcess]] = {}
    for p in held:
        by_gpu.setdefault(p.gpu_index, []).append(p)
    devices = {d.index: d for d in ev.gpus}
    total = sum(p.used_bytes or 0 for p in held)
    idle_for = format_duration(ev.gpu_idle_for_s)
    gpus = ", ".join(str(i) for i in sorted(by_gpu))
    evidence = [_gpu_line(i, procs, devices.get(i)) for i, procs in sorted(by_gpu.items())]
    evidence.append(f"idle for {idle_for} (window {format_duration(window)})")
    return Finding(
        "gpu-idle",
        f"GPU {gpus} idle for {idle_for} while the job holds {format_size(total)}",
        f"The job holds {format_size(total)} on GPU {gpus} but has kept utilisation near 0% for {idle_for}: "
        "the GPU is reserved and does no work.",
        "warning",
        tuple(evidence),
        f"Find what the job waits on instead (`jobwarden dump {job_ref(ev)}`): most often data loading "
        "(raise num_workers, check the disk), a CPU-bound phase, or a hang in a collective. If the job is "
        "done with the GPU (evaluation on CPU, a forgotten notebook), release it (del the model, "
        "torch.cuda.empty_cache()) or stop the job so others can use the GPU.",
        tuple(dict.fromkeys(p.pid for p in held)),
    )


def _gpu_line(index: int, procs: Sequence[GpuProcess], device: GpuDevice | None) -> str:
    held = sum(p.used_bytes or 0 for p in procs)
    pids = ", ".join(str(p.pid) for p in procs)
    line = f"GPU {index}"
    if device is not None:
        line += f" ({device.name})"
    line += f": the job holds {format_size(held)} (pid {pids})"
    if device is not None:
        line += f" of {format_size(device.memory_total_bytes)}"
        if device.utilization_percent is not None:
            idle = " (idle)" if device.utilization_percent < _IDLE_UTILISATION else ""
            line += f", utilisation {device.utilization_percent:.0f}%{idle}"
    return line


# --- stray-gpu-process ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuOwner:
    """What the machine knows about a pid that NVML lists as holding GPU memory: from /proc (parent, user,
    command, age) and from jobwarden's store (the job whose tree or JOBWARDEN_JOB_ID marker it carries).

    `job_id` None: no jobwarden job ever owned it (started by hand, by another tool). `job_live` False with a
    job_id: it belongs to a job whose run has ended, so it outlived its job."""

    pid: int
    ppid: int
    user: str
    cmdline: str
    job_id: str | None = None
    job_live: bool = False
    age_s: float | None = None  # how long it has been running


def stray_gpu_findings(gpu_processes: Sequence[GpuProcess], owners: Mapping[int, GpuOwner]) -> list[Finding]:
    """One `stray-gpu-process` finding per process holding GPU memory that belongs to no live job, largest
    first. A pid missing from `owners` is skipped: /proc does not show it (another container's pid
    namespace), so nothing can be said about it; a process of a live job is that job's business."""
    held: dict[int, list[GpuProcess]] = {}
    for p in gpu_processes:
        owner = owners.get(p.pid)
        if owner is not None and not (owner.job_id is not None and owner.job_live):
            held.setdefault(p.pid, []).append(p)
    strays = sorted(held.items(), key=lambda item: -sum(p.used_bytes or 0 for p in item[1]))
    return [_stray(owners[pid], procs) for pid, procs in strays]


def _stray(owner: GpuOwner, procs: Sequence[GpuProcess]) -> Finding:
    size = format_size(sum(p.used_bytes or 0 for p in procs))
    gpus = ", ".join(str(p.gpu_index) for p in procs)
    orphan = owner.ppid == 1
    if owner.job_id is not None:
        whose = f"was part of job {owner.job_id}, which has ended"
    else:
        whose = "belongs to no jobwarden job"
    age = f", running for {format_duration(owner.age_s)}" if owner.age_s is not None else ""
    evidence = [f"GPU {p.gpu_index}: pid {p.pid} holds {format_size(p.used_bytes)}" for p in procs]
    evidence.append(f"{describe(owner.pid, owner.cmdline)}, user {owner.user}{age}")
    if orphan:
        evidence.append("its parent is gone: re-parented to init (pid 1), an orphan of whatever started it")
    else:
        evidence.append(f"parent pid {owner.ppid}")
    if owner.job_id is not None:
        evidence.append(f"job {owner.job_id}: ended")
    return Finding(
        "stray-gpu-process",
        f"pid {owner.pid} holds {size} on GPU {gpus} and belongs to no live job",
        f"{describe(owner.pid, owner.cmdline, 50)} {whose}, yet holds {size} of GPU memory"
        + (" with no parent left to end it." if orphan else "."),
        "warning",
        tuple(evidence),
        f"If it is not someone's live work, end it: `jobwarden orphans --kill`, or `kill {owner.pid}` "
        f"(then `kill -9 {owner.pid}` if it ignores SIGTERM); it runs as {owner.user}, so that user or root "
        "must do it. Jobs started with `jobwarden run` have their whole tree ended with them, which keeps "
        "this from happening.",
        (owner.pid,),
    )

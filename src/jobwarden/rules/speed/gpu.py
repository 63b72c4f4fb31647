"""GPU speed rules on NVML's view (fake NVML in tests): `gpu-not-used` (GPUs given, the job computes on
the CPU: no CUDA library mapped, no GPU memory held; research/slowness.md 2.3) and `gpu-shared` (a process
outside the job computes on the job's GPU: the maintainers' first guess in "training got slower" threads)."""

from __future__ import annotations

from jobwarden.config import format_duration, format_size
from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import GpuClock, SpeedEvidence

# A job loads its data and model before it touches the GPU; torch built for CUDA maps its CUDA libraries at
# `import torch` (then this rule never fires), so the wait is for other frameworks. Short enough that the
# finding comes within 45 s of the job computing on the CPU (issue 28): the judgement every 4 s adds to it.
UNUSED_AFTER_S = 30.0
CLOCK_SHARE = 0.9  # an SM clock below this share of its most, for a reason that is a limit, is throttling
GPU_IDLE = 0x1
# nvmlClocksEventReason* that are limits, not choices (research/slowness.md 2.10; NVML docs)
LIMITS = {
    0x4: "software power cap",
    0x8: "hardware slowdown (temperature or power too high)",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}


def _pids(ev: SpeedEvidence) -> tuple[int, ...]:
    return (ev.main_pid,) if ev.main_pid is not None else ev.pids[:1]


def gpu_not_used(ev: SpeedEvidence) -> Finding | None:
    if not ev.gpus_claimed or ev.gpu_bytes != 0 or ev.cuda_mapped or ev.gpu_unused_s < UNUSED_AFTER_S:
        return None
    gpus = ", ".join(str(i) for i in ev.gpus_claimed)
    for_ = format_duration(ev.gpu_unused_s)
    evidence = [
        f"GPU {gpus} given to the job; its processes hold no GPU memory (NVML) for {for_}",
        f"the job used {ev.cpu_used:.2f} CPUs meanwhile",
    ]
    if ev.cuda_mapped is False:
        evidence.append("no CUDA library (libcuda, libcudart, libtorch_cuda) in any process's memory map")
    return Finding(
        "gpu-not-used",
        f"GPU {gpus} given, but the job computes on the CPU",
        f"The job was given GPU {gpus} and has worked for {for_} on the CPU without touching it: all of "
        "its GPU time is lost, and the GPU is kept from others.",
        "warning",
        tuple(evidence),
        "Check that the framework sees the GPU (python -c 'import torch; print(torch.cuda.is_available())'; "
        "a '+cpu' build of torch never does), that the model and batches are moved to it "
        "(.to('cuda')), and that CUDA_VISIBLE_DEVICES is not empty; or run it without a GPU.",
        _pids(ev),
    )


def limited(c: GpuClock) -> bool:
    """Its SM clock held below CLOCK_SHARE of its most by a limit, not by idleness."""
    return (
        c.sm_max_mhz > 0
        and c.sm_mhz < CLOCK_SHARE * c.sm_max_mhz
        and not c.reasons & GPU_IDLE
        and any(c.reasons & bit for bit in LIMITS)
    )


def gpu_throttled(ev: SpeedEvidence) -> Finding | None:
    slowed = [c for c in ev.gpu_clocks if limited(c)]
    if not slowed:
        return None
    worst = min(slowed, key=lambda c: c.sm_mhz / c.sm_max_mhz)
    lost = 1 - worst.sm_mhz / worst.sm_max_mhz
    why = [name for bit, name in LIMITS.items() if worst.reasons & bit]
    lines = [
        f"GPU {c.gpu_index}: SM clock {c.sm_mhz} MHz of {c.sm_max_mhz} MHz, NVML clock event reasons "
        f"0x{c.reasons:x} ({', '.join(n for b, n in LIMITS.items() if c.reasons & b)})"
        + (f", utilisation {c.utilization:.0f}%" if c.utilization is not None else "")
        for c in slowed
    ]
    return Finding(
        "gpu-throttled",
        f"GPU {worst.gpu_index} runs at {100 * (1 - lost):.0f}% of its clock: {why[0]}",
        f"The GPU's SM clock is {worst.sm_mhz} MHz of {worst.sm_max_mhz} MHz because of a {why[0]}: "
        f"compute-bound kernels run about {100 * lost:.0f}% slower.",
        "warning" if lost >= 0.2 else "info",
        tuple(lines),
        "Thermal: check the GPU's cooling and airflow (nvidia-smi -q -d TEMPERATURE,PERFORMANCE), "
        "neighbouring GPUs' heat; power: the board's power limit (nvidia-smi -q -d POWER) or the "
        "machine's power supply. Ask the machine's administrator: the job cannot fix it.",
        _pids(ev),
    )


def gpu_shared(ev: SpeedEvidence) -> Finding | None:
    if not ev.gpu_sharers:
        return None
    top = ev.gpu_sharers[0]
    job = f", job {top.job_id}" if top.job_id is not None else ""
    others = f" and {len(ev.gpu_sharers) - 1} more" if len(ev.gpu_sharers) > 1 else ""
    lines = [
        f"GPU {s.gpu_index}: pid {s.pid} ({s.user}{', jobwarden job ' + str(s.job_id) if s.job_id else ''})"
        f" holds {format_size(s.used_bytes) if s.used_bytes is not None else 'memory'}: {s.cmdline[:80]}"
        for s in ev.gpu_sharers[:5]
    ]
    return Finding(
        "gpu-shared",
        f"GPU {top.gpu_index} shared with pid {top.pid} ({top.user}{job}){others}",
        "A process outside the job computes on a GPU the job uses: kernels take turns (time slicing), so "
        "the job gets only part of the GPU and its memory.",
        "warning",
        tuple(lines),
        "Ask the other process's owner to move, or move the job to a free GPU (CUDA_VISIBLE_DEVICES, "
        "jobwarden run --gpus); on a shared server, claim GPUs through jobwarden so that jobs never share "
        "one unknowingly.",
        _pids(ev),
    )

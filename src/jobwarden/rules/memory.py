"""Memory ran out: `oom-kill` (the kernel's OOM killer, or jobwarden's memory watchdog, SIGKILLed a process)
and `cuda-oom` (a GPU allocation failed, from the job's output).

Which SIGKILLs the OOM evidence explains (docs/measurements.md, "OOM evidence"):
- the job's own cgroup counted OOM kills (`cgroup-v1`, `cgroup-v2`) or jobwarden's watchdog killed
  (`watchdog`): every SIGKILL of the run is attributed to it, the kernel-named victims included even when
  jobwarden never saw them (a worker born and killed between two scans);
- only the host counter rose (`host`, /proc/vmstat oom_kill): that is correlation, another job may have
  been the victim. When the kernel log names the victims, only those that are the job's count; without
  names every SIGKILL of the run counts, and the finding says it is inferred.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jobwarden.config import format_size
from jobwarden.model import Finding
from jobwarden.observations import OomEvidence
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.lookup import Lookup, describe

_MECHANISMS = {
    "cgroup-v1": "the job's memory cgroup (v1) reached its limit",
    "cgroup-v2": "the job's memory cgroup (v2) reached its limit",
    "host": "the machine ran out of memory (host OOM killer)",
    "watchdog": "jobwarden's memory watchdog found the job over its --mem-limit",
}


def oom_killed(ev: RunEvidence) -> tuple[int, ...]:
    """The pids whose death the OOM evidence explains, kernel-named victims first."""
    oom = ev.oom
    if oom is None or oom.kills <= 0:
        return ()
    sigkilled = _sigkilled(ev)
    if oom.mechanism == "host" and oom.victims:
        look = Lookup.of(ev)
        ours = {*sigkilled, *look.processes, *look.deaths, ev.pid}
        return tuple(p for p in oom.victims if p in ours)
    return tuple(dict.fromkeys([*oom.victims, *sigkilled]))


def _sigkilled(ev: RunEvidence) -> list[int]:
    pids = [d.pid for d in ev.deaths if d.signal == "SIGKILL"]
    if ev.signal == "SIGKILL" and ev.pid is not None and ev.end_reason not in ("stopped", "timeout"):
        pids.append(ev.pid)
    return list(dict.fromkeys(pids))


def oom_kill(ev: RunEvidence) -> Finding | None:
    victims = oom_killed(ev)
    if not victims or ev.oom is None:
        return None
    oom = ev.oom
    look = Lookup.of(ev)
    limit = oom.limit_bytes or ev.mem_limit_bytes
    what = _MECHANISMS.get(oom.mechanism, f"OOM evidence ({oom.mechanism})")
    container = ev.engine == "container" and oom.mechanism.startswith("cgroup-")
    if container:  # a container's entrypoint makes no cgroup: the limit hit is the container's own
        what = what.replace("the job's memory cgroup", "the container's memory cgroup")
    names = ", ".join(
        describe(p, look.cmdline(p), 50) + (" (the main process)" if p == ev.pid else "") for p in victims[:3]
    )
    if len(victims) == 1:
        summary = f"{names} was SIGKILLed because {what}"
    else:
        more = f" and {len(victims) - 3} more" if len(victims) > 3 else ""
        summary = f"{len(victims)} processes ({names}{more}) were SIGKILLed because {what}"
    summary += f" ({_usage(oom, limit)})." if limit or oom.peak_bytes else "."
    if oom.mechanism == "host" and not oom.victims:
        summary += " Inferred: the host's OOM counter rose during the run and no other cause was seen."
    return Finding(
        "oom-kill",
        _title(oom, limit).replace("the job's memory cgroup", "the container")
        if container
        else _title(oom, limit),
        summary,
        "error",
        tuple(_evidence(ev, oom, limit, victims, look)),
        _container_remedy(limit) if container else _remedy(oom, limit),
        victims,
    )


def _title(oom: OomEvidence, limit: int | None) -> str:
    if oom.mechanism == "watchdog":
        return f"Killed by jobwarden's memory watchdog (--mem-limit {format_size(limit)})"
    if oom.mechanism == "host":
        return "Killed by the kernel OOM killer: the machine ran out of memory"
    at = f" at its {format_size(limit)} limit" if limit else ""
    return f"Killed by the kernel OOM killer: the job's memory cgroup{at}"


def _usage(oom: OomEvidence, limit: int | None) -> str:
    parts = []
    if oom.peak_bytes:
        parts.append(f"peak {format_size(oom.peak_bytes)}")
    if limit:
        parts.append(f"limit {format_size(limit)}")
    return " of ".join(parts) if len(parts) == 2 else parts[0]


def _evidence(
    ev: RunEvidence, oom: OomEvidence, limit: int | None, victims: Sequence[int], look: Lookup
) -> list[str]:
    lines = [f"mechanism: {oom.mechanism}; OOM kills counted during the run: {oom.kills}"]
    if limit or oom.peak_bytes:
        lines.append(f"memory: {_usage(oom, limit)}")
    for pid in victims[:10]:
        death = look.deaths.get(pid)
        how = "killed by SIGKILL" if death or pid == ev.pid else "named by the kernel, not seen by jobwarden"
        lines.append(f"{describe(pid, look.cmdline(pid))}: {how}")
    lines.extend(f"kernel: {line.strip()}" for line in oom.kernel_lines[-4:])
    return lines


def _remedy(oom: OomEvidence, limit: int | None) -> str:
    lower = (
        "lower the job's memory: fewer DataLoader/Pool workers (each forked worker slowly copies the "
        "parent's pages as Python touches their refcounts), smaller batches or prefetch, and datasets held "
        "as numpy arrays or memory-mapped files rather than lists of Python objects"
    )
    if oom.mechanism == "host":
        return (
            "The whole machine ran short, so anything on it may be the cause: check what else ran "
            f"(`jobwarden ps`, `top`), {lower}; give the job a --mem-limit so it is the one stopped, "
            "predictably, if it overgrows."
        )
    raise_it = f"raise --mem-limit above {format_size(limit)}" if limit else "raise the memory limit"
    return f"Either {raise_it} if the peak is what the job legitimately needs, or {lower}."


def _container_remedy(limit: int | None) -> str:
    at = f" above {format_size(limit)}" if limit else ""
    return (
        f"Either raise the container's memory limit{at} (docker run --memory, the pod's "
        "resources.limits.memory) if the peak is what the job legitimately needs, or lower the job's memory: "
        "fewer DataLoader/Pool workers, smaller batches or prefetch, datasets as numpy arrays or "
        "memory-mapped files rather than lists of Python objects."
    )


# --- cuda-oom ---------------------------------------------------------------------------------------

_CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"
    r"|CUDA_ERROR_OUT_OF_MEMORY|RESOURCE_EXHAUSTED: Out of memory|OOM when allocating tensor"
)
_SIZE = r"(\d+(?:\.\d+)? [KMGT]i?B)"
_TRIED = re.compile(rf"Tried to allocate {_SIZE}")
_GPU = re.compile(r"\bGPU (\d+)")
_TOTAL = re.compile(rf"total capac\w* of {_SIZE}|{_SIZE} total capacity")
_FREE = re.compile(rf"of which {_SIZE} is free|{_SIZE} free")
_THIS = re.compile(rf"this process has {_SIZE} memory in use")
_OTHER = re.compile(rf"Process (\d+) has {_SIZE} memory in use")
_UNALLOCATED = re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated")
_MAX_LINE = 400


def cuda_oom(ev: RunEvidence) -> Finding | None:
    """Fires on a failed or hung run: a job that caught the error and went on (a batch-size finder) and
    then succeeded has no finding."""
    failed = ev.exit_code not in (None, 0) or ev.signal is not None
    if not failed and ev.hang_window_s is None:
        return None
    line = next((line for line in reversed(ev.log_tail) if _CUDA_OOM.search(line)), None)
    if line is None:
        return None
    text = line.strip()
    others = _OTHER.findall(text)
    return Finding(
        "cuda-oom",
        _cuda_title(text),
        _cuda_summary(text),
        "error",
        tuple(_cuda_evidence(text, others)),
        _cuda_remedy(text, others),
        (ev.pid,) if ev.pid else (),
    )


def _first(pattern: re.Pattern[str], text: str) -> str | None:
    m = pattern.search(text)
    return next((g for g in m.groups() if g), None) if m else None


def _cuda_title(text: str) -> str:
    tried, gpu = _first(_TRIED, text), _first(_GPU, text)
    on = f" on GPU {gpu}" if gpu else ""
    return f"CUDA out of memory{on}" + (f" allocating {tried}" if tried else "")


def _cuda_summary(text: str) -> str:
    tried, free, total = _first(_TRIED, text), _first(_FREE, text), _first(_TOTAL, text)
    if tried and free and total:
        return f"A GPU allocation of {tried} failed with only {free} of {total} free, and the job died of it."
    return "A GPU memory allocation failed (the CUDA runtime or a library on it ran out of device memory)."


def _cuda_evidence(text: str, others: list[tuple[str, str]]) -> list[str]:
    shown = text if len(text) <= _MAX_LINE else text[: _MAX_LINE - 3] + "..."
    lines = [f"output: {shown}"]
    figures = [
        (label, value)
        for label, value in (
            ("tried to allocate", _first(_TRIED, text)),
            ("GPU total", _first(_TOTAL, text)),
            ("free", _first(_FREE, text)),
            ("held by this process", _first(_THIS, text)),
            ("reserved by PyTorch but unallocated", _first(_UNALLOCATED, text)),
        )
        if value
    ]
    if figures:
        lines.append("; ".join(f"{label}: {value}" for label, value in figures))
    lines.extend(f"another process on the GPU: pid {pid} holds {size}" for pid, size in others)
    return lines


def _cuda_remedy(text: str, others: list[tuple[str, str]]) -> str:
    steps = []
    if others:
        pids = ", ".join(pid for pid, _ in others)
        steps.append(
            f"another process holds memory on this GPU (pid {pids}): stop it (`jobwarden orphans` finds "
            "leftovers of earlier runs) or run on a free GPU (--gpu-ids)"
        )
    steps.append(
        "lower the batch size and keep the effective batch with gradient accumulation; trade compute for "
        "memory with activation (gradient) checkpointing and bf16/fp16 mixed precision"
    )
    if _UNALLOCATED.search(text) or "fragmentation" in text:
        steps.append(
            "much memory is reserved but unallocated (fragmentation): set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        )
    if not others:
        steps.append("check `nvidia-smi` for another process on the same GPU")
    text = "; ".join(steps) + "."
    return text[0].upper() + text[1:]

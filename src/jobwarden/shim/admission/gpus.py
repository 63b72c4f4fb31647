"""GPU admission: which GPUs are free, claiming them for a run atomically against every other jobwarden job,
and, while a run waits, saying who holds the others (a live job, or a stray that outlived its own).

A GPU is free when no compute process holds it, less than `DEFAULT_BUSY_BYTES` of its memory is used,
and no live run claims it. Claims matter between a claim and the job's first CUDA call: NVML shows the
GPU idle until then, which is how task-spooler's GPU mode lands two jobs on one GPU (its issues #8, #59).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobwarden.observations import GpuDevice, GpuProcess
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.gpu import GpuProbe, GpuProbeError, GpuUnavailable
from jobwarden.rules.gpurequest import GpuRequest, cuda_visible_devices, impossible_request
from jobwarden.shim.admission.gpuholders import (
    GpuHolder,
    format_gpu_bytes,
    gpu_holders,
    holders_of,
    job_name,
    run_is_live,
)
from jobwarden.store import Store

__all__ = [
    "CUDA_DEVICE_ORDER",
    "CUDA_VISIBLE_DEVICES",
    "DEFAULT_BUSY_BYTES",
    "Admission",
    "BusyGpu",
    "GpuHolder",
    "GpuRequest",
    "cuda_visible_devices",
    "describe_wait",
    "free_gpus",
    "gpu_env",
    "gpu_holders",
    "impossible_request",
    "live_claims",
    "try_admit",
]

# 1 GiB: above what an idle GPU shows as used (driver reservations of a few hundred MiB on recent boards,
# a desktop's Xorg), far below any training job; and absolute, not a share of the GPU: the stray of seed
# case S5 held 5.5 GiB, under 10% of an 80 GiB GPU, so task-spooler's "90% free" rule calls it free.
# Processes NVML lists are caught by the compute-process test whatever their size; the threshold is for
# holders it cannot list (another container, a VM).
DEFAULT_BUSY_BYTES = 1 << 30

# What the job is told. Indexes are NVML's (nvidia-smi's), which follow the PCI bus; CUDA by default
# numbers the fastest GPU first, so on a machine with mixed GPUs CUDA_VISIBLE_DEVICES=1 could select
# another board than NVML's GPU 1 -- the job would run on a GPU it never claimed. PCI_BUS_ID order makes
# both count the same way (CUDA programming guide, "CUDA Environment Variables").
_HOLDERS_SHOWN = 3  # per GPU in a wait line

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"


def gpu_env(indexes: Sequence[int]) -> dict[str, str]:
    """The variables a job started on `indexes` gets (they replace any the caller had)."""
    return {CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: cuda_visible_devices(indexes)}


def free_gpus(
    devices: Sequence[GpuDevice],
    processes: Sequence[GpuProcess],
    claims: Mapping[int, object],
    memory_threshold_bytes: int = DEFAULT_BUSY_BYTES,
) -> list[int]:
    """Indexes of the free GPUs among `devices`, lowest first. `claims`: GPU index -> claimant, live
    claims only (`live_claims`). A GPU missing from `devices` (unreadable) is never free."""
    computing = {p.gpu_index for p in processes if "compute" in p.kind}
    return sorted(
        d.index
        for d in devices
        if d.index not in computing and d.memory_used_bytes < memory_threshold_bytes and d.index not in claims
    )


def live_claims(store: Store) -> dict[int, tuple[int, int]]:
    """GPU index -> (job id, run) of the claims whose run is still live (queued to stopping, or lost)."""
    return {i: owner for i, owner in store.gpu_claims().items() if run_is_live(store, *owner)}


# --- admission ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BusyGpu:
    """A GPU the run wanted or could have had, and why it cannot."""

    index: int
    memory_used_bytes: int | None = None
    holders: tuple[GpuHolder, ...] = ()
    claimed_by: tuple[int, int] | None = None  # (job id, run)
    claimed_by_name: str | None = None
    unreadable: str | None = None

    def describe(self) -> str:
        if self.unreadable:
            return f"GPU {self.index} unreadable ({self.unreadable})"
        # the biggest holders first, a few at most: a status line, not a process table (`orphans` has it)
        biggest = sorted(self.holders, key=lambda h: (-(h.used_bytes or 0), h.pid))
        parts = [f"{h.label()} {format_gpu_bytes(h.used_bytes)}" for h in biggest[:_HOLDERS_SHOWN]]
        if len(biggest) > _HOLDERS_SHOWN:
            parts.append(f"{len(biggest) - _HOLDERS_SHOWN} more")
        claim = ""
        if self.claimed_by and not any(h.job_id == self.claimed_by[0] for h in self.holders):
            name = f" ({self.claimed_by_name})" if self.claimed_by_name else ""
            claim = f"claimed by job {self.claimed_by[0]}{name} run {self.claimed_by[1]}"
        if parts:
            return f"GPU {self.index} held by {', '.join(parts)}" + (f", {claim}" if claim else "")
        if claim:
            return f"GPU {self.index} {claim}"
        used = format_gpu_bytes(self.memory_used_bytes)
        return f"GPU {self.index} has {used} in use by no process NVML lists (another container or VM?)"


@dataclass(frozen=True)
class Admission:
    """The answer to one `try_admit`: GPUs claimed, or why the run waits (busy, error) or cannot ever run
    here (impossible: the shim should fail the run with that message rather than wait forever)."""

    request: GpuRequest
    claimed: tuple[int, ...] = ()
    free: tuple[int, ...] = ()  # free GPUs seen, when too few
    busy: tuple[BusyGpu, ...] = ()
    error: str | None = None  # NVML could not answer this time; try again
    impossible: str | None = None

    @property
    def admitted(self) -> bool:
        return bool(self.claimed)

    @property
    def env(self) -> dict[str, str]:
        return gpu_env(self.claimed) if self.claimed else {}


def try_admit(
    store: Store,
    job_id: int,
    run: int,
    probe: GpuProbe | GpuUnavailable | None,
    count: int | None = None,
    ids: Sequence[int] | None = None,
    *,
    now: float,
    procfs: ProcFS | None = None,
    memory_threshold_bytes: int = DEFAULT_BUSY_BYTES,
) -> Admission:
    """Claim GPUs for a run if enough are free now (one write transaction: `Store.claim_gpus`), else say
    why not. Calling it again after a claim returns the same claim. A new attempt of a job takes over the
    claims of its earlier attempts: they are dropped, so its own leftovers block it only while NVML still
    shows them on the GPU, never through a claim that would hold it forever."""
    request = GpuRequest.of(count, ids)
    own = sorted(i for i, owner in store.gpu_claims().items() if owner == (job_id, run))
    if own:
        return Admission(request, claimed=tuple(own))
    if not isinstance(probe, GpuProbe):
        why = str(probe) if probe else "NVML is not available (see `jobwarden doctor`)"
        return Admission(request, impossible=f"cannot use GPUs on this machine: {why}")
    try:
        devices, processes = probe.devices(), probe.processes()
    except GpuProbeError as err:
        return Admission(request, error=str(err))
    unreadable = dict(probe.device_errors)
    impossible = impossible_request(request, len(devices) + len(unreadable))
    if impossible:
        return Admission(request, impossible=impossible)
    _take_over_earlier_claims(store, job_id, run)
    claims = live_claims(store)
    free = free_gpus(devices, processes, claims, memory_threshold_bytes)
    candidates = [i for i in free if request.ids is None or i in request.ids]
    if len(candidates) >= request.count:
        claimed = store.claim_gpus(job_id, run, candidates, request.count, now)
        if claimed:
            return Admission(request, claimed=tuple(claimed))
        claims = live_claims(store)  # another job won the race: explain with its claim
        free = [i for i in free if i not in claims]
    wanted = set(request.ids) if request.ids is not None else {d.index for d in devices} | set(unreadable)
    busy = _busy(
        store, procfs or ProcFS(), sorted(wanted - set(free)), devices, processes, unreadable, claims
    )
    return Admission(request, free=tuple(free), busy=busy)


def _take_over_earlier_claims(store: Store, job_id: int, run: int) -> None:
    for earlier in {r for j, r in store.gpu_claims().values() if j == job_id and r != run}:
        store.release_gpus(job_id, earlier)


def _busy(
    store: Store,
    procfs: ProcFS,
    indexes: Sequence[int],
    devices: Sequence[GpuDevice],
    processes: Sequence[GpuProcess],
    unreadable: Mapping[int, str],
    claims: Mapping[int, tuple[int, int]],
) -> tuple[BusyGpu, ...]:
    used = {d.index: d.memory_used_bytes for d in devices}
    holders = holders_of(store, [p for p in processes if p.gpu_index in indexes], procfs)
    return tuple(
        BusyGpu(
            index=i,
            memory_used_bytes=used.get(i),
            holders=tuple(h for h in holders if h.gpu_index == i),
            claimed_by=claims.get(i),
            claimed_by_name=job_name(store, claims[i][0]) if i in claims else None,
            unreadable=unreadable.get(i),
        )
        for i in indexes
    )


def describe_wait(admission: Admission) -> str:
    """One line for `status` of a queued run: 'waiting for 2 free GPUs (1 free now): GPU 0 held by job 12
    (train) pid 4242 5.1 GiB; GPU 1 held by stray pid 999 (user ana, python loop.py) 5.5 GiB'."""
    request = admission.request
    if admission.admitted:
        return f"claimed {GpuRequest(len(admission.claimed), admission.claimed).describe()}"
    if admission.impossible:
        return admission.impossible
    head = f"waiting for {request.describe()}"
    if request.ids is None and admission.free:
        head += f" ({len(admission.free)} free now)"
    if admission.error:
        return f"{head}: {admission.error}"
    reasons = [b.describe() for b in admission.busy]
    return f"{head}: {'; '.join(reasons)}" if reasons else f"{head}: another job claimed them first"

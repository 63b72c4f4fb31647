"""`io-bound` and `memory-thrash`: the job waits on storage, or re-reads pages memory pressure evicted.

Waiting on storage shows as threads in D state (wchan in the page cache or the block layer) and as I/O
pressure; py-spy calls such a thread idle (research/slowness.md 2.9), so the thread state is what counts.
Thrashing shows as major faults with memory pressure; readahead turns sequential refaults into minor ones
(measured: 1 major fault per 48 MB pass), so pressure is the stronger sign and faults only confirm."""

from __future__ import annotations

from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import SpeedEvidence

DSTATE_SHARE = 0.3
IO_PRESSURE = 0.1
MAJFLT_PER_S = 50.0
MEMORY_PRESSURE = 0.05
REFAULTS_PER_S = 1000.0  # 4 MB/s of pages read back after eviction: the working set does not fit
WARN_SHARE = 0.4
# memory-thrash must cost this share of the time (stalled on memory, or waiting for the pages read back):
# pages read back at no cost are no slowness (a job's start-up re-reading libraries that others evicted)
MIN_THRASH_SHARE = 0.05


def _pids(ev: SpeedEvidence) -> tuple[int, ...]:
    return (ev.main_pid,) if ev.main_pid is not None else ev.pids[:1]


def io_bound(ev: SpeedEvidence) -> Finding | None:
    if ev.dstate_share < DSTATE_SHARE or ev.window_s <= 0:
        return None
    if memory_thrash(ev) is not None:  # it waits on storage for pages memory pressure evicted: the cause
        return None
    pressure = ev.io_some_s / ev.window_s if ev.io_some_s is not None else None
    if pressure is not None and pressure < IO_PRESSURE:
        return None
    evidence = [
        f"a process of the job was in D state (waiting on storage) in {100 * ev.dstate_share:.0f}% "
        f"of the readings over {ev.window_s:.0f}s"
    ]
    if pressure is not None:
        evidence.append(
            f"{ev.pressure_scope} I/O pressure: some task stalled {100 * pressure:.0f}% of the time"
        )
    return Finding(
        "io-bound",
        f"waits on storage {100 * ev.dstate_share:.0f}% of the time",
        f"The job's processes wait for reads or writes {100 * ev.dstate_share:.0f}% of the time; that share "
        "of its time is lost to storage.",
        "warning" if ev.dstate_share >= WARN_SHARE else "info",
        tuple(evidence),
        "Read from faster or local storage (copy the dataset to local disk or /dev/shm), read ahead with "
        "more DataLoader workers and prefetch_factor, use larger files (shards, not millions of small "
        "ones), and write checkpoints less often or in the background.",
        _pids(ev),
    )


def memory_thrash(ev: SpeedEvidence) -> Finding | None:
    if ev.window_s <= 0:
        return None
    pressure = ev.memory_some_s / ev.window_s if ev.memory_some_s is not None else 0.0
    faults = ev.majflt / ev.window_s
    refaults = (ev.refault_pages or 0) / ev.window_s
    swapping = pressure >= MEMORY_PRESSURE and (faults >= MAJFLT_PER_S or ev.pressure_scope == "cgroup")
    if not swapping and refaults < REFAULTS_PER_S:
        return None
    # what it costs: the time its tasks stalled on memory, or waited for the pages to be read back
    io = ev.io_some_s / ev.window_s if ev.io_some_s is not None else 0.0
    share = max(pressure, min(io, ev.dstate_share) if ev.dstate_share else 0.0)
    if share < MIN_THRASH_SHARE:
        return None
    evidence = [f"{ev.majflt} major faults in {ev.window_s:.0f}s across the job"]
    if ev.refault_pages is not None:
        evidence.insert(
            0,
            f"{ev.refault_pages} pages read back after eviction (memory cgroup "
            f"workingset_refault) in {ev.window_s:.0f}s: {refaults:.0f}/s",
        )
    if ev.memory_some_s is not None:
        evidence.append(
            f"{ev.pressure_scope} memory pressure: some {100 * pressure:.0f}%"
            + (f", full {100 * ev.memory_full_s / ev.window_s:.0f}%" if ev.memory_full_s is not None else "")
        )
    if ev.dstate_share:
        evidence.append(f"in D state (waiting for the pages) in {100 * ev.dstate_share:.0f}% of the readings")
    return Finding(
        "memory-thrash",
        f"re-reads evicted memory: stalled {100 * share:.0f}% of the time",
        f"Pages the job needs were evicted and are read back again ({refaults:.0f} pages/s, {faults:.0f} "
        f"major faults/s); its tasks stalled {100 * share:.0f}% of the time on it.",
        "warning" if share >= WARN_SHARE else "info",
        tuple(evidence),
        "Give the job more memory (a higher cgroup or container limit, --mem-limit) or need less: a smaller "
        "batch or cache, fewer DataLoader workers (each holds a copy of what it touches), a dataset that "
        "fits the page cache or is read once per epoch in order.",
        _pids(ev),
    )

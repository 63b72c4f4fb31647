"""Each tick's sample of the whole run, and its downsampling as it ages (store/rollup.py).

A sample holds the tree's gauges (CPU %, RSS, processes), the run's counters (CPU seconds, bytes read and
written) and its GPU use. Counters are the run's totals, not only its live members': a worker that ends
takes its CPU seconds and bytes with it from /proc, but not from the run, so the totals never go back
and a rate derived from two samples is never negative.

Every reading feeds the tiers, also those not written as raw rows (an idle tree is rewritten only every
10 s): a point's mean is that of the 1 Hz readings. The shim is its run's only writer of samples: it
stores each point as it closes, drops expired rows at most once a minute, and closes the open points when
the run ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import ProcessId, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.record.recorder import RunRecorder
from jobwarden.store.rollup import PRUNE_EVERY_S, Bucket, GpuReading, Reading, Rollup

if TYPE_CHECKING:  # the GPU watch is loaded only on machines with a GPU
    from jobwarden.progress.model import Progress
    from jobwarden.shim.tree.jobtree import Member
    from jobwarden.shim.watch.gpuwatch import GpuWatch


class _Seen:
    """What a member had used when last read: its stat line (unchanged: not scheduled, so no new CPU
    time nor I/O) and its counters."""

    __slots__ = ("raw_stat", "read", "ticks", "write")

    def __init__(self, raw_stat: bytes, ticks: int, read: int, write: int) -> None:
        self.raw_stat, self.ticks, self.read, self.write = raw_stat, ticks, read, write


class RunCounters:
    """CPU ticks and storage bytes of every process the run has had: the live members' current figures
    plus the last figures of those that ended."""

    def __init__(self, procfs: ProcFS) -> None:
        self.procfs = procfs
        self._live: dict[ProcessId, _Seen] = {}
        self._gone_ticks = self._gone_read = self._gone_write = 0
        self._io_known = False  # /proc/PID/io is hidden for other users' processes

    def update(self, members: Iterable[Member]) -> tuple[float, int | None, int | None]:
        """(CPU seconds, bytes read, bytes written) of the run so far; I/O None while unreadable."""
        live: dict[ProcessId, _Seen] = {}
        for member in members:
            seen = self._live.get(member.ident)
            if seen is None or seen.raw_stat is not member.raw_stat:
                seen = self._read(member, seen)
            live[member.ident] = seen
        for ident, seen in self._live.items():
            if ident not in live:
                self._gone_ticks += seen.ticks
                self._gone_read += seen.read
                self._gone_write += seen.write
        self._live = live
        ticks = self._gone_ticks + sum(s.ticks for s in live.values())
        if not self._io_known:
            return ticks / self.procfs.ticks_per_s, None, None
        read = self._gone_read + sum(s.read for s in live.values())
        write = self._gone_write + sum(s.write for s in live.values())
        return ticks / self.procfs.ticks_per_s, read, write

    def _read(self, member: Member, before: _Seen | None) -> _Seen:
        try:
            io = self.procfs.io(member.pid)
        except (ProcessGone, AccessDenied):
            io = None
        if io is not None:
            self._io_known = True
            read, write = io
        else:
            read, write = (before.read, before.write) if before else (0, 0)
        return _Seen(member.raw_stat, member.last_ticks or 0, read, write)


def gpu_reading(watch: GpuWatch | None) -> tuple[float | None, int | None, tuple[GpuReading, ...]]:
    """(mean utilisation, memory held, each GPU) from the watch's last NVML reading; (None, None, ())
    without GPUs."""
    usage = watch.usage if watch else None
    if watch is None or usage is None or not usage.gpus:
        return None, None, ()
    held: dict[int, int | None] = dict.fromkeys(usage.gpus, 0)
    for proc in watch.processes:
        if proc.gpu_index in held:
            known = held[proc.gpu_index]
            held[proc.gpu_index] = (
                None if known is None or proc.used_bytes is None else known + proc.used_bytes
            )
    gpus = tuple(GpuReading(i, usage.utilization.get(i), held[i]) for i in usage.gpus)
    utils = [g.util for g in gpus if g.util is not None]
    return (sum(utils) / len(utils) if utils else None), usage.total_bytes, gpus


class Sampler:
    def __init__(self, procfs: ProcFS, record: RunRecorder) -> None:
        self.counters = RunCounters(procfs)
        self.record = record
        self.rollup = Rollup()
        self.closed: list[Bucket] = []  # points closed and not stored yet
        self._next_prune: float | None = None

    def reading(
        self,
        now: float,
        snaps: Sequence[ProcessSnapshot],
        members: Iterable[Member],
        gpu: GpuWatch | None,
        progress: Progress | None = None,
    ) -> Reading:
        """The run now, its progress with it (shim.watch.progresswatch); fed to the tiers at once."""
        cpu_time_s, read, write = self.counters.update(members)
        gpu_util, gpu_memory, gpus = gpu_reading(gpu)
        reading = Reading(
            at=now,
            nprocs=len(snaps),
            cpu_percent=round(sum(s.cpu_percent or 0.0 for s in snaps), 1),
            rss_bytes=sum(s.rss_bytes for s in snaps),
            cpu_time_s=round(cpu_time_s, 2),
            io_read_bytes=read,
            io_write_bytes=write,
            gpu_util=gpu_util,
            gpu_memory_bytes=gpu_memory,
            gpus=gpus,
            step=progress.step if progress else None,
            step_rate=progress.rate if progress else None,
            metrics=progress.metrics if progress else (),
        )
        if snaps:  # a tree with no process left has nothing to average
            self.closed += self.rollup.add(reading)
        return reading

    def write(self, now: float, snaps: list[ProcessSnapshot], reading: Reading) -> bool:
        """The tick's processes and sample, and the points that closed, in one transaction."""
        rollups = tuple(self.closed)
        if not self.record.write(self.record.store.record_tree, now, snaps, [], reading, rollups):
            return False
        del self.closed[: len(rollups)]
        return True

    def keep_up(self, now: float) -> None:
        """Points that closed on a tick that wrote no sample, and expired rows once a minute."""
        prune = self._next_prune is None or now >= self._next_prune
        if not (self.closed or prune):
            return
        rollups = tuple(self.closed)
        if self.record.write(self.record.store.add_samples, (), rollups, now if prune else None):
            del self.closed[: len(rollups)]
            if prune:
                self._next_prune = now + PRUNE_EVERY_S

    def finish(self, now: float) -> None:
        """The run ended: its open points are closed and stored, whatever their length."""
        self.closed += self.rollup.flush()
        self._next_prune = None
        self.keep_up(now)

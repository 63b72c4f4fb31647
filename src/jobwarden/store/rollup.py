"""Samples as they age: raw readings (at most 1 Hz) kept an hour, then 10 s, 1 min and 10 min points.

Pure logic, no SQL, so that tier boundaries, merge weights and expiry are tested on a fake clock.

A point of a tier (a `Bucket`) keeps, for each gauge (CPU %, RSS, processes, GPU utilisation and memory),
the mean and the max of the readings it covers: a memory spike must survive the averaging. Counters (CPU
seconds, bytes read and written) keep their last value; rates are derived on reading. The shim feeds
every reading to the 10 s tier; a 10 s point that closes is merged into the open 1 min point, a 1 min
point into the 10 min one. Merges weigh each gauge by how many readings it holds.

Kept (RETENTION_S): raw readings 1 h, 10 s points 24 h, 1 min points 7 days, 10 min points the job's
life. A 30-day job then holds ~3,600 + 8,640 + 10,080 + 4,320 rows instead of 2.6 million.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

RAW = 0  # the "tier" of raw readings
TIERS: tuple[int, ...] = (10, 60, 600)  # seconds per point; each divides the next
RETENTION_S: dict[int, float] = {RAW: 3600.0, 10: 86400.0, 60: 7 * 86400.0}  # 600: never expires
PRUNE_EVERY_S = 60.0


class GpuReading(NamedTuple):
    """One GPU the job uses: NVML's utilisation of the whole GPU, and the memory the job holds on it."""

    gpu_index: int
    util: float | None
    memory_bytes: int | None


class Reading(NamedTuple):
    """The job's tree at one moment, as the shim saw it (one row of `samples`)."""

    at: float
    nprocs: int | None
    cpu_percent: float | None
    rss_bytes: int | None
    cpu_time_s: float | None = None  # counters: the run's totals so far
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    gpu_util: float | None = None  # mean over the job's GPUs
    gpu_memory_bytes: int | None = None  # total over the job's GPUs
    gpus: tuple[GpuReading, ...] = ()
    step: int | None = None  # progress: the job's step counter then (a counter: the last value is kept)
    step_rate: float | None = None  # steps per second, as jobwarden measured them (a gauge)
    metrics: tuple[tuple[str, float], ...] = ()  # what the job reported (loss...): gauges by name


class Gauge:
    """Mean and max of the known values of one gauge. `count` is the merge weight."""

    __slots__ = ("count", "peak", "total")

    def __init__(self, total: float = 0.0, count: int = 0, peak: float | None = None) -> None:
        self.total, self.count, self.peak = total, count, peak

    @classmethod
    def stored(cls, mean: float | None, peak: float | None, count: int) -> Gauge:
        """A gauge read back from its mean and max over `count` readings."""
        return cls() if mean is None else cls(mean * count, count, mean if peak is None else peak)

    def add(self, value: float | None) -> None:
        if value is not None:
            self.total += value
            self.count += 1
            self.peak = value if self.peak is None else max(self.peak, value)

    def merge(self, other: Gauge) -> None:
        self.total += other.total
        self.count += other.count
        if other.peak is not None:
            self.peak = other.peak if self.peak is None else max(self.peak, other.peak)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


class Bucket:
    """One point of a tier: the readings whose time falls in [at, at + tier). Raw readings become buckets
    of tier 0 when read, so that every point merges the same way."""

    __slots__ = (
        "at",
        "cpu",
        "cpu_time_s",
        "gpu_mem",
        "gpu_util",
        "gpus",
        "io_read",
        "io_write",
        "metrics",
        "n",
        "nprocs",
        "rss",
        "step",
        "step_rate",
        "tier",
    )

    def __init__(self, tier: int, at: float) -> None:
        self.tier, self.at, self.n = tier, at, 0
        self.nprocs, self.cpu, self.rss = Gauge(), Gauge(), Gauge()
        self.gpu_util, self.gpu_mem = Gauge(), Gauge()
        self.gpus: dict[int, tuple[Gauge, Gauge]] = {}  # GPU index -> (utilisation, memory)
        self.cpu_time_s: float | None = None
        self.io_read: int | None = None
        self.io_write: int | None = None
        self.step: int | None = None
        self.step_rate = Gauge()
        self.metrics: dict[str, Gauge] = {}

    @property
    def end(self) -> float:
        return self.at + self.tier

    @classmethod
    def of(cls, reading: Reading) -> Bucket:
        bucket = cls(RAW, reading.at)
        bucket.add(reading)
        return bucket

    def add(self, r: Reading) -> None:
        self.n += 1
        self.nprocs.add(r.nprocs)
        self.cpu.add(r.cpu_percent)
        self.rss.add(r.rss_bytes)
        self.gpu_util.add(r.gpu_util)
        self.gpu_mem.add(r.gpu_memory_bytes)
        for gpu in r.gpus:
            util, mem = self.gpus.setdefault(gpu.gpu_index, (Gauge(), Gauge()))
            util.add(gpu.util)
            mem.add(gpu.memory_bytes)
        self._last_counters(r.cpu_time_s, r.io_read_bytes, r.io_write_bytes)
        self.step = self.step if r.step is None else r.step
        self.step_rate.add(r.step_rate)
        for name, value in r.metrics:
            self.metrics.setdefault(name, Gauge()).add(value)

    def merge(self, other: Bucket) -> None:
        """Fold in a later point (a finer tier's, or a neighbour when points are thinned on reading)."""
        self.n += other.n
        for mine, theirs in (
            (self.nprocs, other.nprocs),
            (self.cpu, other.cpu),
            (self.rss, other.rss),
            (self.gpu_util, other.gpu_util),
            (self.gpu_mem, other.gpu_mem),
        ):
            mine.merge(theirs)
        for index, (util, mem) in other.gpus.items():
            my_util, my_mem = self.gpus.setdefault(index, (Gauge(), Gauge()))
            my_util.merge(util)
            my_mem.merge(mem)
        self._last_counters(other.cpu_time_s, other.io_read, other.io_write)
        self.step = self.step if other.step is None else other.step
        self.step_rate.merge(other.step_rate)
        for name, gauge in other.metrics.items():
            self.metrics.setdefault(name, Gauge()).merge(gauge)

    def _last_counters(self, cpu_time_s: float | None, io_read: int | None, io_write: int | None) -> None:
        self.cpu_time_s = self.cpu_time_s if cpu_time_s is None else cpu_time_s
        self.io_read = self.io_read if io_read is None else io_read
        self.io_write = self.io_write if io_write is None else io_write


def bucket_start(at: float, tier: int) -> float:
    return math.floor(at / tier) * tier


class Rollup:
    """The open point of each tier, fed one reading at a time by the run's single writer (its shim).

    `add` and `flush` return the points that closed, finest first, for the caller to store."""

    def __init__(self) -> None:
        self._open: dict[int, Bucket] = {}

    def add(self, reading: Reading) -> list[Bucket]:
        closed = self._close_until(reading.at)
        finest = self._open.get(TIERS[0])
        if finest is None:
            finest = self._open[TIERS[0]] = Bucket(TIERS[0], bucket_start(reading.at, TIERS[0]))
        # a wall clock stepped back lands in the open point: late, never lost
        finest.add(reading)
        return closed

    def flush(self) -> list[Bucket]:
        """Close every open point (the run ended): its last minutes reach every tier."""
        return self._close_until(math.inf)

    def _close_until(self, now: float) -> list[Bucket]:
        closed = []
        for i, tier in enumerate(TIERS):
            bucket = self._open.get(tier)
            if bucket is None or bucket.end > now:
                continue
            del self._open[tier]
            closed.append(bucket)
            if i + 1 < len(TIERS):  # the coarser tier's open point, checked in the next turn of the loop
                coarse = TIERS[i + 1]
                parent = self._open.get(coarse)
                if parent is None:
                    parent = self._open[coarse] = Bucket(coarse, bucket_start(bucket.at, coarse))
                parent.merge(bucket)
        return closed


def expiry(now: float) -> dict[int, float]:
    """Tier -> the time before which its points are dropped (10 min points are never dropped)."""
    return {tier: now - keep for tier, keep in RETENTION_S.items()}


def choose_tier(span_s: float, points: int | None) -> int:
    """The coarsest tier that still gives at least `points` points over `span_s` (RAW: the finest)."""
    if not points or points <= 0 or span_s <= 0:
        return RAW
    step = span_s / points
    return max((tier for tier in TIERS if tier <= step), default=RAW)


# (tier, lo, hi) -> that tier's points with lo <= at and at + tier <= hi, oldest first
Fetch = Callable[[int, float, float], list[Bucket]]


def stitch(fetch: Fetch, preferred: int, since: float = -math.inf) -> list[Bucket]:
    """One history from `since` on, oldest first: the preferred tier's points, then the older history
    only coarser tiers still hold before them, and the newest, not rolled up yet, from finer tiers after
    them. Each tier is asked only for the stretch it fills. A coarse point overlapping finer ones is
    left out (it would count their readings twice): a seam may miss at most one coarse interval."""
    order = (RAW, *TIERS)
    at = order.index(preferred)

    def first(tier: int) -> float:  # the point that holds `since` counts
        return since if tier == RAW or since == -math.inf else bucket_start(since, tier)

    points = fetch(preferred, first(preferred), math.inf)
    for tier in order[at + 1 :]:
        start = points[0].at if points else math.inf
        points = fetch(tier, first(tier), start) + points
    for tier in reversed(order[:at]):
        end = points[-1].end if points else -math.inf
        points += fetch(tier, max(end, first(tier)), math.inf)
    return points


def thin(points: Sequence[Bucket], start: float, end: float, most: int) -> list[Bucket]:
    """At most `most` points: neighbours in each of `most` equal slices of [start, end] merged."""
    if most <= 0 or len(points) <= most:
        return list(points)
    step = max(end - start, 1e-9) / most
    out: list[Bucket] = []
    slot = None
    for point in points:
        here = min(max(int((point.at - start) / step), 0), most - 1)
        if here != slot:
            slot = here
            merged = Bucket(max(point.tier, math.ceil(step)), point.at)
            out.append(merged)
        out[-1].merge(point)
    return out


def merged(points: Iterable[Bucket], tier: int, at: float) -> Bucket:
    bucket = Bucket(tier, at)
    for point in points:
        bucket.merge(point)
    return bucket

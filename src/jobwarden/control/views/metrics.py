"""A run's metric history, as every frontend reads it: `metrics`, `status`, the web page, the TUI.

`job_samples` stitches the raw samples and the downsampled tiers (store/rollup.py) into one history of
the whole run, oldest first, at about the resolution asked for; `sparkline` draws a series in one line.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jobwarden.clock import iso, plausible
from jobwarden.store import Store
from jobwarden.store.rollup import RAW, TIERS, Bucket, choose_tier, stitch, thin

BLOCKS = "▁▂▃▄▅▆▇█"


class GpuSample(NamedTuple):
    index: int  # type: ignore[assignment]  # the GPU's index, as nvidia-smi shows it (shadows tuple.index)
    util: float | None  # percent of the whole GPU (other jobs on it count too)
    memory_bytes: int | None  # held by the job's processes


class Sample(NamedTuple):
    """The run at one moment; a point of a tier stands for the interval from `at` of `step_s` seconds,
    its gauges the means over it, with the maxima in `*_max_*`."""

    at: float  # wall time
    cpu_percent: float | None
    rss_bytes: int | None
    nprocs: int | None
    io_read_bytes: int | None  # counters: the run's totals so far
    io_write_bytes: int | None
    gpu_util: float | None  # percent, mean over the job's GPUs
    gpu_memory_bytes: int | None  # total over the job's GPUs
    cpu_time_s: float | None
    gpus: tuple[GpuSample, ...] = ()
    rss_max_bytes: int | None = None  # only where the point merges several readings
    cpu_max_percent: float | None = None
    step_s: float = 0.0  # 0: one raw reading
    step: int | None = None  # progress: the job's step counter (the last of the point)
    step_rate: float | None = None  # steps per second measured by jobwarden (the mean of the point)
    metrics: tuple[tuple[str, float], ...] = ()  # what the job reported (loss...): the means of the point

    def to_json(self) -> dict[str, Any]:
        return {
            "at": iso(self.at),
            "t": self.at,
            "cpu_percent": self.cpu_percent,
            "rss_bytes": self.rss_bytes,
            "nprocs": self.nprocs,
            "io_read_bytes": self.io_read_bytes,
            "io_write_bytes": self.io_write_bytes,
            "gpu_util": self.gpu_util,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "cpu_time_s": self.cpu_time_s,
            "gpus": [g._asdict() for g in self.gpus],
            "rss_max_bytes": self.rss_max_bytes,
            "cpu_max_percent": self.cpu_max_percent,
            "step_s": self.step_s,
            "step": self.step,
            "step_rate": self.step_rate,
            "metrics": dict(self.metrics),
        }

    @classmethod
    def of(cls, point: Bucket) -> Sample:
        merged = point.tier != RAW or point.n > 1
        return cls(
            at=point.at,
            cpu_percent=_round(point.cpu.mean, 1),
            rss_bytes=_int(point.rss.mean),
            nprocs=_int(point.nprocs.mean),
            io_read_bytes=point.io_read,
            io_write_bytes=point.io_write,
            gpu_util=_round(point.gpu_util.mean, 1),
            gpu_memory_bytes=_int(point.gpu_mem.mean),
            cpu_time_s=point.cpu_time_s,
            gpus=tuple(
                GpuSample(i, _round(u.mean, 1), _int(m.mean)) for i, (u, m) in sorted(point.gpus.items())
            ),
            rss_max_bytes=_int(point.rss.peak) if merged else None,
            cpu_max_percent=point.cpu.peak if merged else None,
            step_s=float(point.tier),
            step=point.step,
            step_rate=_round(point.step_rate.mean, 3),
            metrics=tuple((name, g.mean) for name, g in point.metrics.items() if g.mean is not None),
        )


def job_samples(
    store: Store,
    job_id: int,
    run: int,
    since: float | None = None,
    points: int | None = None,
    now: float | None = None,
) -> list[Sample]:
    """The run's samples from `since` (wall time; None: its start) on, oldest first, covering its whole
    history: the tier that gives about `points` points over the range (None: the finest kept), older
    history from coarser tiers, the newest from finer ones; at most `points` points."""
    record = store.run(job_id, run)
    # a start or end stored at an impossible time (1e300) bounds nothing: the run's samples do instead
    started = record.started_at if plausible(record.started_at) else None
    ended = record.ended_at if plausible(record.ended_at) else None
    end = ended or (time.time() if now is None else now)

    def fetch(tier: int, lo: float, hi: float) -> list[Bucket]:
        if tier == RAW:
            return [Bucket.of(r) for r in store.readings(job_id, run, lo, hi)]
        return store.rollups(job_id, run, tier, lo, hi)

    first = started or _first_sample(store, job_id, run) or end
    start = first if since is None else max(since, first)
    history = stitch(fetch, choose_tier(end - start, points), -math.inf if since is None else since)
    if points:
        history = thin(history, start, end, points)
    # a sample stamped outside years 1-9999 (1e300: a broken clock, a hand-edited row) has no place on
    # the time axis: skipped, rather than failing every time and rate derived from it
    return [Sample.of(point) for point in history if plausible(point.at)]


class RunSamples(NamedTuple):
    job_id: int
    name: str
    run: int
    samples: list[Sample]
    malformed: int  # sample rows the store holds that jobwarden did not write, skipped


def run_samples(
    home: Path,
    job_ref: str | int,
    run_n: int | None,
    since: float | None = None,
    points: int | None = None,
    now: float | None = None,
) -> RunSamples:
    """`job_samples` of run `run_n` (None: the latest) of the job `job_ref` names, read from the home's
    store, with the count of the malformed rows skipped."""
    with Store(home) as store:
        job = store.job(job_ref)
        run = store.run(job.id, run_n)
        found = job_samples(store, job.id, run.n, since=since, points=points, now=now)
        return RunSamples(job.id, job.name, run.n, found, store.malformed_samples)


def _first_sample(store: Store, job_id: int, run: int) -> float | None:
    """When the run's history begins, for a run with no start on record (an old, adopted one)."""
    firsts = [r.at for r in store.readings(job_id, run)[:1]]
    firsts += [b.at for tier in TIERS for b in store.rollups(job_id, run, tier)[:1]]
    return min(firsts, default=None)


def per_second(samples: Sequence[Sample], counter: str) -> list[float | None]:
    """A counter's rate between each sample and the one before it (None for the first, and where the
    counter is unknown or was reset by a restarted supervisor)."""
    rates: list[float | None] = [None] if samples else []
    for before, after in itertools.pairwise(samples):
        a, b = getattr(before, counter), getattr(after, counter)
        elapsed = after.at - before.at
        ok = a is not None and b is not None and b >= a and elapsed > 0
        rates.append((b - a) / elapsed if ok else None)
    return rates


def sparkline(values: Sequence[float | None], width: int, top: float | None = None) -> str:
    """One line of block characters, one per value, scaled from 0 to `top` (default: the largest value);
    a blank where a value is unknown. More values than `width`: each character stands for the largest of
    its share (a spike survives)."""
    if width <= 0 or not values:
        return ""
    if len(values) > width:
        values = [
            _largest(values[i * len(values) // width : (i + 1) * len(values) // width]) for i in range(width)
        ]
    known = [v for v in values if v is not None]
    scale = top if top is not None else max(known, default=0.0)
    chars = []
    for value in values:
        if value is None:
            chars.append(" ")
        elif scale <= 0:
            chars.append(BLOCKS[0])
        else:
            level = min(max(value / scale, 0.0), 1.0)
            chars.append(BLOCKS[round(level * (len(BLOCKS) - 1))])
    return "".join(chars)


def _largest(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)

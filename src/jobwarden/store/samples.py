"""The SQL of samples: raw readings in `samples`, downsampled points in `samples_rollup` (store/rollup.py).

Functions over a connection (`Store.record_tree` calls them inside its transaction), and the methods of
`Store` that read and write samples alone."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from jobwarden.paths import Layout
from jobwarden.store.db import translate, write
from jobwarden.store.rollup import RAW, Bucket, Gauge, GpuReading, Reading, expiry

MIB = 1 << 20


class SampleMethods:
    """`Store`'s methods for samples (a base class of it, kept here beside their SQL)."""

    _conn: sqlite3.Connection
    layout: Layout

    def add_samples(
        self,
        job_id: int,
        run: int,
        readings: Sequence[Reading] = (),
        rollups: Sequence[Bucket] = (),
        prune_at: float | None = None,
    ) -> None:
        """Raw samples and downsampled points that closed, in one transaction; with `prune_at` (the
        time now), also drop what each tier keeps no longer (store/rollup.py)."""
        try:
            with write(self._conn):
                insert_readings(self._conn, job_id, run, readings)
                insert_buckets(self._conn, job_id, run, rollups)
                if prune_at is not None:
                    prune(self._conn, job_id, run, prune_at)
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def readings(
        self, job_id: int, run: int, since: float = -math.inf, until: float = math.inf
    ) -> list[Reading]:
        """The run's raw samples taken from `since` to `until`, oldest first."""
        try:
            return read_raw(self._conn, job_id, run, since, until)
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def rollups(
        self, job_id: int, run: int, tier: int, since: float = -math.inf, until: float = math.inf
    ) -> list[Bucket]:
        """The run's points of one tier (store/rollup.py) starting from `since` and ended by `until`,
        oldest first."""
        try:
            return read_tier(self._conn, job_id, run, tier, since, until)
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err


_RAW_INSERT = (
    "INSERT INTO samples (job_id, run, at, nprocs, cpu_percent, rss_bytes, cpu_time_s, io_bytes, "
    "io_read_bytes, io_write_bytes, gpu_util, gpu_memory_bytes, gpus, step, step_rate, metrics) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_ROLLUP_INSERT = (
    "INSERT OR REPLACE INTO samples_rollup (job_id, run, tier, at, n, nprocs_avg, nprocs_max, cpu_avg, "
    "cpu_max, rss_avg_mib, rss_max_mib, cpu_time_s, io_read_bytes, io_write_bytes, gpu_util_avg, "
    "gpu_util_max, gpu_mem_avg_mib, gpu_mem_max_mib, gpus, step, step_rate_avg, step_rate_max, metrics) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


def insert_readings(conn: sqlite3.Connection, job_id: int, run: int, readings: Sequence[Reading]) -> None:
    conn.executemany(_RAW_INSERT, [_raw_row(job_id, run, r) for r in readings])


def insert_buckets(conn: sqlite3.Connection, job_id: int, run: int, buckets: Sequence[Bucket]) -> None:
    """Closed points. OR REPLACE: a point closed again by a restarted shim holds the newer figures."""
    conn.executemany(_ROLLUP_INSERT, [_rollup_row(job_id, run, b) for b in buckets])


def prune(conn: sqlite3.Connection, job_id: int, run: int, now: float) -> None:
    """Drop what each tier keeps no longer (coarser tiers hold it)."""
    for tier, before in expiry(now).items():
        if tier == RAW:
            conn.execute("DELETE FROM samples WHERE job_id = ? AND run = ? AND at < ?", (job_id, run, before))
        else:
            conn.execute(
                "DELETE FROM samples_rollup WHERE job_id = ? AND run = ? AND tier = ? AND at < ?",
                (job_id, run, tier, before),
            )


def read_raw(
    conn: sqlite3.Connection, job_id: int, run: int, lo: float = -math.inf, hi: float = math.inf
) -> list[Reading]:
    """Raw samples with lo <= at <= hi, oldest first."""
    rows = conn.execute(
        "SELECT * FROM samples WHERE job_id = ? AND run = ? AND at >= ? AND at <= ? ORDER BY at",
        (job_id, run, _finite(lo), _finite(hi)),
    )
    return [_reading(row) for row in rows]


def read_tier(
    conn: sqlite3.Connection, job_id: int, run: int, tier: int, lo: float = -math.inf, hi: float = math.inf
) -> list[Bucket]:
    """A tier's points with lo <= at and at + tier <= hi, oldest first."""
    rows = conn.execute(
        "SELECT * FROM samples_rollup WHERE job_id = ? AND run = ? AND tier = ? AND at >= ? AND at <= ? "
        "ORDER BY at",
        (job_id, run, tier, _finite(lo), _finite(hi - tier)),
    )
    return [_bucket(row) for row in rows]


def _finite(bound: float) -> float:
    """SQLite compares with no infinity: a bound past every time instead."""
    return max(min(bound, 1e300), -1e300)


def _raw_row(job_id: int, run: int, r: Reading) -> tuple[Any, ...]:
    io = None if r.io_read_bytes is None or r.io_write_bytes is None else r.io_read_bytes + r.io_write_bytes
    gpus = json.dumps([list(g) for g in r.gpus], separators=(",", ":")) if r.gpus else None
    return (
        job_id,
        run,
        r.at,
        r.nprocs,
        r.cpu_percent,
        r.rss_bytes,
        r.cpu_time_s,
        io,
        r.io_read_bytes,
        r.io_write_bytes,
        r.gpu_util,
        r.gpu_memory_bytes,
        gpus,
        r.step,
        _rate(r.step_rate),
        _metrics_json(r.metrics),
    )


def _rate(value: float | None) -> float | None:
    """A step rate stored with 4 significant digits: a chart needs no finer."""
    return None if value is None else float(f"{value:.4g}")


def _metrics_json(metrics: Iterable[tuple[str, float]]) -> str | None:
    found = {name: float(f"{value:.6g}") for name, value in metrics}
    return json.dumps(found, separators=(",", ":")) if found else None


def _metrics_of(text: str | None) -> tuple[tuple[str, float], ...]:
    """Stored metrics back; anything but a JSON object of numbers is left out (the job named them)."""
    if not text:
        return ()
    try:
        found = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(found, dict):
        return ()
    return tuple(
        (str(k), float(v)) for k, v in found.items() if isinstance(v, int | float) and not isinstance(v, bool)
    )


def _reading(row: sqlite3.Row) -> Reading:
    keys = row.keys()

    def column(name: str) -> Any:  # a database at schema 2 lacks the later columns
        return row[name] if name in keys else None

    gpus = column("gpus")
    return Reading(
        at=row["at"],
        nprocs=row["nprocs"],
        cpu_percent=row["cpu_percent"],
        rss_bytes=row["rss_bytes"],
        cpu_time_s=column("cpu_time_s"),
        io_read_bytes=column("io_read_bytes"),
        io_write_bytes=column("io_write_bytes"),
        gpu_util=column("gpu_util"),
        gpu_memory_bytes=column("gpu_memory_bytes"),
        gpus=tuple(GpuReading(*g) for g in json.loads(gpus)) if gpus else (),
        step=column("step"),
        step_rate=column("step_rate"),
        metrics=_metrics_of(column("metrics")),
    )


def _rounded(value: float | None) -> int | None:
    """Means stored short: SQLite stores an integral number in 1 to 6 bytes, any other REAL in 8. A
    30-day job keeps ~23,000 points (goal: under 3 MiB in all); a chart needs no finer figures."""
    return None if value is None else round(value)


def _mib(value: float | None, peak: bool = False) -> int | None:
    """Bytes in MiB (2 bytes stored, not 6); a peak rounded up, never below what was seen."""
    if value is None:
        return None
    return math.ceil(value / MIB) if peak else round(value / MIB)


def _rollup_row(job_id: int, run: int, b: Bucket) -> tuple[Any, ...]:
    # each GPU as [index, mean utilisation %, mean and max memory in MiB]: the spike that ends in a CUDA
    # out-of-memory error is one GPU's
    gpus = [
        [i, _rounded(u.mean), _mib(m.mean), _mib(m.peak, peak=True)] for i, (u, m) in sorted(b.gpus.items())
    ]
    return (
        job_id,
        run,
        b.tier,
        b.at,
        b.n,
        _rounded(b.nprocs.mean),
        b.nprocs.peak,
        _rounded(b.cpu.mean),
        _rounded(b.cpu.peak),
        _mib(b.rss.mean),
        _mib(b.rss.peak, peak=True),
        _rounded(b.cpu_time_s),  # whole seconds: a rate over 10 s or more needs no finer
        b.io_read,
        b.io_write,
        _rounded(b.gpu_util.mean),
        b.gpu_util.peak,
        _mib(b.gpu_mem.mean),
        _mib(b.gpu_mem.peak, peak=True),
        json.dumps(gpus, separators=(",", ":")) if gpus else None,
        b.step,
        _rate(b.step_rate.mean),
        _rate(b.step_rate.peak),
        _metrics_json((name, g.mean) for name, g in b.metrics.items() if g.mean is not None),
    )


def _bucket(row: sqlite3.Row) -> Bucket:
    b = Bucket(row["tier"], row["at"])
    n = b.n = row["n"]
    b.nprocs = Gauge.stored(row["nprocs_avg"], row["nprocs_max"], n)
    b.cpu = Gauge.stored(row["cpu_avg"], row["cpu_max"], n)
    b.rss = Gauge.stored(_bytes(row["rss_avg_mib"]), _bytes(row["rss_max_mib"]), n)
    b.gpu_util = Gauge.stored(row["gpu_util_avg"], row["gpu_util_max"], n)
    b.gpu_mem = Gauge.stored(_bytes(row["gpu_mem_avg_mib"]), _bytes(row["gpu_mem_max_mib"]), n)
    b.cpu_time_s, b.io_read, b.io_write = row["cpu_time_s"], row["io_read_bytes"], row["io_write_bytes"]
    if row["gpus"]:
        for index, util, mem_mib, mem_max_mib in json.loads(row["gpus"]):  # [index, util, MiB, max MiB]
            mem = Gauge.stored(_bytes(mem_mib), _bytes(mem_max_mib), n)
            b.gpus[index] = (Gauge.stored(util, None, n), mem)
    keys = row.keys()
    if "step" in keys:  # a database before progress (schema 7) has none of these
        b.step = row["step"]
        b.step_rate = Gauge.stored(row["step_rate_avg"], row["step_rate_max"], n)
        b.metrics = {name: Gauge.stored(value, None, n) for name, value in _metrics_of(row["metrics"])}
    return b


def _bytes(mib: int | None) -> int | None:
    return None if mib is None else mib * MIB

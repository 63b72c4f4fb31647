"""The SQL of samples: raw readings in `samples`, downsampled points in `samples_rollup` (store/rollup.py).

Functions over a connection, called by `Store` inside its transactions."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from jobwarden.store.rollup import RAW, Bucket, Gauge, GpuReading, Reading, expiry

_RAW_INSERT = (
    "INSERT INTO samples (job_id, run, at, nprocs, cpu_percent, rss_bytes, cpu_time_s, io_bytes, "
    "io_read_bytes, io_write_bytes, gpu_util, gpu_memory_bytes, gpus) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_ROLLUP_INSERT = (
    "INSERT OR REPLACE INTO samples_rollup (job_id, run, tier, at, n, nprocs_avg, nprocs_max, cpu_avg, "
    "cpu_max, rss_avg, rss_max, cpu_time_s, io_read_bytes, io_write_bytes, gpu_util_avg, gpu_util_max, "
    "gpu_mem_avg, gpu_mem_max, gpus) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
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


def read_raw(conn: sqlite3.Connection, job_id: int, run: int, since: float | None) -> list[Reading]:
    rows = conn.execute(
        "SELECT * FROM samples WHERE job_id = ? AND run = ? AND at >= ? ORDER BY at",
        (job_id, run, -1.0 if since is None else since),
    )
    return [_reading(row) for row in rows]


def read_tier(
    conn: sqlite3.Connection, job_id: int, run: int, tier: int, since: float | None
) -> list[Bucket]:
    """The tier's points that end after `since`, oldest first."""
    rows = conn.execute(
        "SELECT * FROM samples_rollup WHERE job_id = ? AND run = ? AND tier = ? AND at > ? ORDER BY at",
        (job_id, run, tier, -1.0 if since is None else since - tier),
    )
    return [_bucket(row) for row in rows]


def _raw_row(job_id: int, run: int, r: Reading) -> tuple[Any, ...]:
    io = None if r.io_read_bytes is None or r.io_write_bytes is None else r.io_read_bytes + r.io_write_bytes
    gpus = json.dumps([list(g) for g in r.gpus]) if r.gpus else None
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
    )


def _rounded(value: float | None, digits: int | None = None) -> float | int | None:
    """Means stored short: bytes and counts as integers, percentages to 0.1 (SQLite stores an integral
    REAL as an integer, in 1 to 8 bytes instead of 8)."""
    if value is None:
        return None
    return round(value) if digits is None else round(value, digits)


def _rollup_row(job_id: int, run: int, b: Bucket) -> tuple[Any, ...]:
    gpus = (
        json.dumps(
            [
                [i, _rounded(u.mean, 1), u.peak, _rounded(m.mean), m.peak]
                for i, (u, m) in sorted(b.gpus.items())
            ]
        )
        if b.gpus
        else None
    )
    return (
        job_id,
        run,
        b.tier,
        b.at,
        b.n,
        _rounded(b.nprocs.mean, 2),
        b.nprocs.peak,
        _rounded(b.cpu.mean, 1),
        b.cpu.peak,
        _rounded(b.rss.mean),
        b.rss.peak,
        b.cpu_time_s,
        b.io_read,
        b.io_write,
        _rounded(b.gpu_util.mean, 1),
        b.gpu_util.peak,
        _rounded(b.gpu_mem.mean),
        b.gpu_mem.peak,
        gpus,
    )


def _bucket(row: sqlite3.Row) -> Bucket:
    b = Bucket(row["tier"], row["at"])
    n = b.n = row["n"]
    b.nprocs = Gauge.stored(row["nprocs_avg"], row["nprocs_max"], n)
    b.cpu = Gauge.stored(row["cpu_avg"], row["cpu_max"], n)
    b.rss = Gauge.stored(row["rss_avg"], row["rss_max"], n)
    b.gpu_util = Gauge.stored(row["gpu_util_avg"], row["gpu_util_max"], n)
    b.gpu_mem = Gauge.stored(row["gpu_mem_avg"], row["gpu_mem_max"], n)
    b.cpu_time_s, b.io_read, b.io_write = row["cpu_time_s"], row["io_read_bytes"], row["io_write_bytes"]
    if row["gpus"]:
        for index, util_avg, util_max, mem_avg, mem_max in json.loads(row["gpus"]):
            b.gpus[index] = (Gauge.stored(util_avg, util_max, n), Gauge.stored(mem_avg, mem_max, n))
    return b

"""The SQL of samples: raw readings in `samples`, downsampled points in `samples_rollup` (store/rollup.py).

Functions over a connection (store/processes.py's `record_tree` calls them inside its transaction), and
those over the store's `Database` (store/db.py) that read and write samples alone, which `Store` delegates
to."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from jobwarden.clock import plausible
from jobwarden.store.db import Database, translate, write
from jobwarden.store.progress import stored_metrics
from jobwarden.store.rollup import RAW, Bucket, Gauge, GpuReading, Reading, expiry

MIB = 1 << 20
T = TypeVar("T")


def add_samples(
    db: Database,
    job_id: int,
    run: int,
    readings: Sequence[Reading] = (),
    rollups: Sequence[Bucket] = (),
    prune_at: float | None = None,
) -> None:
    """Raw samples and downsampled points that closed, in one transaction; with `prune_at` (the
    time now), also drop what each tier keeps no longer (store/rollup.py)."""
    try:
        with write(db.conn):
            insert_readings(db.conn, job_id, run, readings)
            insert_buckets(db.conn, job_id, run, rollups)
            if prune_at is not None:
                prune(db.conn, job_id, run, prune_at)
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


def readings(
    db: Database, job_id: int, run: int, since: float = -math.inf, until: float = math.inf
) -> list[Reading]:
    """The run's raw samples taken from `since` to `until`, oldest first (malformed rows skipped and
    counted in `db.malformed`)."""
    found, bad = db.translated(lambda: read_raw(db.conn, job_id, run, since, until))
    db.malformed |= bad
    return found


def rollups(
    db: Database, job_id: int, run: int, tier: int, since: float = -math.inf, until: float = math.inf
) -> list[Bucket]:
    """The run's points of one tier (store/rollup.py) starting from `since` and ended by `until`,
    oldest first."""
    found, bad = db.translated(lambda: read_tier(db.conn, job_id, run, tier, since, until))
    db.malformed |= bad
    return found


def latest_sample(db: Database, job_id: int, run: int) -> sqlite3.Row | None:
    """The newest well-formed raw sample (a malformed one is skipped and counted, the one before it
    read instead: a few at most)."""
    rows = db.exec(
        "SELECT * FROM samples WHERE job_id = ? AND run = ? ORDER BY at DESC LIMIT 8", (job_id, run)
    )
    for row in rows:
        try:
            return checked_sample(row)
        except Malformed:
            db.malformed.add(row_key(row))
    return None


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


class Malformed(ValueError):
    """A sample row that jobwarden did not write (SQLite keeps any value in any column): a number that is
    text, a GPU list that is not JSON. Skipped and counted by the readers, never the end of a command."""


def read_raw(
    conn: sqlite3.Connection, job_id: int, run: int, lo: float = -math.inf, hi: float = math.inf
) -> tuple[list[Reading], set[tuple[Any, ...]]]:
    """Raw samples with lo <= at <= hi, oldest first; and the malformed rows skipped."""
    rows = conn.execute(
        "SELECT * FROM samples WHERE job_id = ? AND run = ? AND at >= ? AND at <= ? ORDER BY at",
        (job_id, run, _finite(lo), _finite(hi)),
    )
    return _well_formed(rows, _reading)


def read_tier(
    conn: sqlite3.Connection, job_id: int, run: int, tier: int, lo: float = -math.inf, hi: float = math.inf
) -> tuple[list[Bucket], set[tuple[Any, ...]]]:
    """A tier's points with lo <= at and at + tier <= hi, oldest first; and the malformed rows skipped."""
    rows = conn.execute(
        "SELECT * FROM samples_rollup WHERE job_id = ? AND run = ? AND tier = ? AND at >= ? AND at <= ? "
        "ORDER BY at",
        (job_id, run, tier, _finite(lo), _finite(hi - tier)),
    )
    return _well_formed(rows, _bucket)


def _well_formed(
    rows: Iterable[sqlite3.Row], read: Callable[[sqlite3.Row], T]
) -> tuple[list[T], set[tuple[Any, ...]]]:
    """The rows `read` accepts; and the keys of those it refused (one row read twice counts once)."""
    found, bad = [], set()
    for row in rows:
        try:
            found.append(read(row))
        except Malformed:
            bad.add(row_key(row))
    return found, bad


def row_key(row: sqlite3.Row) -> tuple[Any, ...]:
    names = row.keys()
    return (row["job_id"], row["run"], row["tier"] if "tier" in names else 0, repr(row["at"]))


def checked_sample(row: sqlite3.Row) -> sqlite3.Row:
    """A raw sample row whose every number is one (as `ps` and `/metrics` read them); raises Malformed."""
    _reading(row)
    return row


def _number(value: Any) -> Any:
    """A stored number as it was written, or None; raises Malformed for anything else."""
    if value is None or (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ):
        return value
    raise Malformed(f"not a number: {value!r}")


def _gpu_list(text: Any, arity: int) -> list[list[Any]]:
    """The JSON list of per-GPU lists in a sample; raises Malformed."""
    if text is None:
        return []
    try:
        items = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        items = None
    if not isinstance(items, list) or not all(isinstance(i, list) and len(i) == arity for i in items):
        raise Malformed(f"not a GPU list: {text!r}"[:200])
    return [[_number(v) for v in item] for item in items]


def _finite(bound: float) -> float:
    """SQLite compares with no infinity: a bound past every time instead (a float: an int this large,
    a bucket's start computed from an absurd time, overflows SQLite's INTEGER)."""
    return max(min(float(bound), 1e300), -1e300)


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


def _reading(row: sqlite3.Row) -> Reading:
    keys = row.keys()

    def column(name: str) -> Any:  # a database at schema 2 lacks the later columns
        return row[name] if name in keys else None

    at = _number(row["at"])
    if at is None or not plausible(at):
        raise Malformed("a sample without a time, or at an impossible one")
    return Reading(
        at=at,
        nprocs=_number(row["nprocs"]),
        cpu_percent=_number(row["cpu_percent"]),
        rss_bytes=_number(row["rss_bytes"]),
        cpu_time_s=_number(column("cpu_time_s")),
        io_read_bytes=_number(column("io_read_bytes")),
        io_write_bytes=_number(column("io_write_bytes")),
        gpu_util=_number(column("gpu_util")),
        gpu_memory_bytes=_number(column("gpu_memory_bytes")),
        gpus=tuple(GpuReading(*g) for g in _gpu_list(column("gpus"), 3)),
        step=_number(column("step")),
        step_rate=_number(column("step_rate")),
        metrics=stored_metrics(column("metrics")),
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
    names = row.keys()  # a Row iterates over its values
    value = {name: _number(row[name]) for name in names if name not in ("gpus", "metrics")}
    if not plausible(value["at"]) or not isinstance(value["n"], int) or value["n"] < 1:
        raise Malformed("a point without a time (or at an impossible one) or a count")
    b = Bucket(row["tier"], value["at"])
    n = b.n = value["n"]
    b.nprocs = Gauge.stored(value["nprocs_avg"], value["nprocs_max"], n)
    b.cpu = Gauge.stored(value["cpu_avg"], value["cpu_max"], n)
    b.rss = Gauge.stored(_bytes(value["rss_avg_mib"]), _bytes(value["rss_max_mib"]), n)
    b.gpu_util = Gauge.stored(value["gpu_util_avg"], value["gpu_util_max"], n)
    b.gpu_mem = Gauge.stored(_bytes(value["gpu_mem_avg_mib"]), _bytes(value["gpu_mem_max_mib"]), n)
    b.cpu_time_s, b.io_read, b.io_write = value["cpu_time_s"], value["io_read_bytes"], value["io_write_bytes"]
    for index, util, mem_mib, mem_max_mib in _gpu_list(row["gpus"], 4):  # [index, util, MiB, max MiB]
        mem = Gauge.stored(_bytes(mem_mib), _bytes(mem_max_mib), n)
        b.gpus[index] = (Gauge.stored(util, None, n), mem)
    if "step" in names:  # a database before progress (schema 9) has none of these
        b.step = value["step"]
        b.step_rate = Gauge.stored(value["step_rate_avg"], value["step_rate_max"], n)
        b.metrics = {name: Gauge.stored(v, None, n) for name, v in stored_metrics(row["metrics"])}
    return b


def _bytes(mib: int | None) -> int | None:
    return None if mib is None else mib * MIB

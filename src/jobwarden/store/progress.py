"""The progress of each run: its latest, read by every list (`ps`, the web, /metrics) and kept after the run
ends, so that `explain` of a crash says how far it got. The series lives beside the samples
(store/samples.py: step, step rate and metrics of each sample and rollup point).

The shim of the run is the only writer; readers get `progress.model.Progress` back. Functions over the
store's `Database` (store/db.py); `Store` delegates."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from jobwarden.store.db import Database, translate, write

if TYPE_CHECKING:  # loaded by the reads: `run` imports the store and never reads progress
    from jobwarden.progress.model import Metrics, Progress

_COLUMNS = (
    "at, step, total, unit, rate, epoch, source, format, observed, label, rank, closed, stalled_since, "
    "first_step, epochs, per_epoch"
)
# read back in the order of Progress's fields, the metrics (a list shows none) between epoch and source:
# a list of 10,000 runs builds each with Progress._make, no keyword or unpacking
_AS_PROGRESS = (
    "step, total, rate, unit, epoch, source, format, at, label, COALESCE(observed, 'log'), rank, closed, "
    "first_step, stalled_since, epochs, COALESCE(per_epoch, 0)"
)
_CHUNK = 500  # job ids per IN (...): SQLite before 3.32 allows 999 parameters in a statement


def set_progress(db: Database, job_id: int, run: int, progress: Progress) -> None:
    """The run's latest progress; the first step it showed is kept from the first write (a shim that
    adopts the run must not move where it resumed)."""
    metrics = json.dumps(dict(progress.metrics), separators=(",", ":")) if progress.metrics else None
    try:
        with write(db.conn):
            db.conn.execute(
                f"INSERT INTO progress (job_id, run, {_COLUMNS}, metrics) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (job_id, run) DO UPDATE SET at = excluded.at, step = excluded.step, "
                "total = excluded.total, unit = excluded.unit, rate = excluded.rate, "
                "epoch = excluded.epoch, source = excluded.source, format = excluded.format, "
                "observed = excluded.observed, label = excluded.label, rank = excluded.rank, "
                "closed = excluded.closed, stalled_since = excluded.stalled_since, "
                "first_step = COALESCE(progress.first_step, excluded.first_step), "
                "epochs = excluded.epochs, per_epoch = excluded.per_epoch, metrics = excluded.metrics",
                (job_id, run, *_row(progress), metrics),
            )
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


def progress(db: Database, job_id: int, run: int) -> Progress | None:
    """The run's latest progress, with its metrics; None when it never showed any."""
    row = db.exec(
        f"SELECT metrics, {_AS_PROGRESS} FROM progress WHERE job_id = ? AND run = ?", (job_id, run)
    ).fetchone()
    return None if row is None else _progress(row[1:], stored_metrics(row[0]))


def progress_of_runs(
    db: Database, runs: Iterable[tuple[int, int]], metrics: bool = False
) -> dict[tuple[int, int], Progress]:
    """(job id, run) -> its latest progress, for a list (one query). The metrics only when asked:
    a table shows none, and 10,000 runs' JSON costs a list of them some 30 ms."""
    from jobwarden.progress.model import Progress

    wanted = set(runs)
    job_ids = sorted({job_id for job_id, _ in wanted})
    if not job_ids:
        return {}
    if len(job_ids) > _CHUNK:  # a long list: one pass over the range beats a lookup per job
        where, params = "job_id BETWEEN ? AND ?", [job_ids[0], job_ids[-1]]
    else:
        where, params = f"job_id IN ({', '.join('?' * len(job_ids))})", job_ids
    make, found = Progress._make, {}
    extra = "metrics" if metrics else "NULL"
    sql = f"SELECT job_id, run, {extra}, {_AS_PROGRESS} FROM progress WHERE {where}"
    for row in db.exec(sql, params):
        key = (row[0], row[1])
        if key in wanted:
            found[key] = make((*row[3:8], stored_metrics(row[2]) if row[2] else (), *row[8:]))
    return found


def _row(p: Progress) -> tuple[Any, ...]:
    return (
        p.at,
        p.step,
        p.total,
        p.unit,
        p.rate,
        p.epoch,
        p.source,
        p.format,
        p.observed,
        p.label,
        p.rank,
        int(p.closed),
        p.stalled_since,
        p.first_step,
        p.epochs,
        int(p.per_epoch),
    )


def _progress(row: Sequence[Any], metrics: Metrics) -> Progress:
    """A row of _AS_PROGRESS's columns, with the run's metrics."""
    from jobwarden.progress.model import Progress

    return Progress._make((*row[:5], metrics, *row[5:]))


def stored_metrics(text: str | None) -> Metrics:
    """The stored metrics (a run's progress, a sample, a point), as the shim wrote them
    (progress.model.finite_metrics kept them finite and few); a list decodes thousands, so only the shape
    is checked: an object of numbers, anything else left out (the job named them)."""
    if not text:
        return ()
    try:
        found = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(found, dict):
        return ()
    return tuple((k, v) for k, v in found.items() if type(v) is float or type(v) is int)

"""A run's process tree: one row per process (keyed by pid and start time), written each tick of its shim
with the tick's sample, in one transaction. Functions over the store's `Database` (store/db.py); `Store`
delegates."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from jobwarden.model import ProcessEnd, ProcessSnapshot, Ranks
from jobwarden.store import samples
from jobwarden.store.db import Database, translate, write
from jobwarden.store.records import ProcessRecord
from jobwarden.store.rollup import Bucket, Reading

_LIVE = (
    "INSERT INTO processes (job_id, run, pid, start_time, ppid, cmdline, state, rss_bytes, "
    "cpu_percent, first_seen, gpu_memory_bytes, rank, local_rank, group_rank) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (job_id, run, pid, start_time) DO UPDATE SET ppid = excluded.ppid, "
    "state = excluded.state, rss_bytes = excluded.rss_bytes, "
    "cpu_percent = excluded.cpu_percent, gpu_memory_bytes = excluded.gpu_memory_bytes"
)
_ENDED = (
    "INSERT INTO processes (job_id, run, pid, start_time, ppid, cmdline, state, first_seen, "
    "ended_at, wait_status, rank, local_rank, group_rank) "
    "VALUES (?,?,?,?,?,?,'X',?,?,?,?,?,?) "
    "ON CONFLICT (job_id, run, pid, start_time) DO UPDATE SET state = 'X', "
    "ended_at = COALESCE(processes.ended_at, excluded.ended_at), "
    "wait_status = COALESCE(processes.wait_status, excluded.wait_status)"
)


def record_tree(
    db: Database,
    job_id: int,
    run: int,
    now: float,
    live: Sequence[ProcessSnapshot],
    ended: Sequence[ProcessEnd],
    sample: Reading | None = None,
    rollups: Sequence[Bucket] = (),
) -> None:
    """One tick of the shim in one transaction: the live processes, those that ended, the run's totals
    as a sample (`sample`, else the sums of `live`) and the downsampled points that closed. An ended
    process the shim never saw alive (it died within milliseconds, and only the kernel's process
    events or its reaping parent told of it) gets its row here."""
    conn = db.conn
    try:
        with write(conn):
            conn.executemany(
                _LIVE,
                [
                    (
                        job_id,
                        run,
                        p.pid,
                        p.start_time,
                        p.ppid,
                        p.cmdline,
                        p.state,
                        p.rss_bytes,
                        p.cpu_percent,
                        now,
                        p.gpu_memory_bytes,
                        *_ranks_row(p.ranks),
                    )
                    for p in live
                ],
            )
            conn.executemany(
                _ENDED,
                [
                    (
                        job_id,
                        run,
                        e.pid,
                        e.start_time,
                        e.ppid,
                        e.cmdline,
                        e.at,
                        e.at,
                        e.status,
                        *_ranks_row(e.ranks),
                    )
                    for e in ended
                ],
            )
            if sample is None and live:
                sample = Reading(
                    now,
                    len(live),
                    sum(p.cpu_percent or 0.0 for p in live),
                    sum(p.rss_bytes for p in live),
                )
            if sample is not None:
                samples.insert_readings(conn, job_id, run, [sample])
            samples.insert_buckets(conn, job_id, run, rollups)
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


def processes(db: Database, job_id: int, run: int, live_only: bool = False) -> list[ProcessRecord]:
    sql = "SELECT * FROM processes WHERE job_id = ? AND run = ?"
    if live_only:
        sql += " AND ended_at IS NULL"
    return [ProcessRecord.from_row(r) for r in db.exec(sql + " ORDER BY first_seen, pid", (job_id, run))]


def _ranks_row(ranks: Ranks | None) -> tuple[int | None, int | None, int | None]:
    return (ranks.rank, ranks.local_rank, ranks.group_rank) if ranks else (None, None, None)

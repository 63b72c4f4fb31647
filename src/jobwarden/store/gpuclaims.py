"""GPU claims: which run holds which GPU index, claimed atomically against every other jobwarden job on
the machine. Functions over the store's `Database` (store/db.py); `Store` delegates."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from jobwarden.model import UNFINISHED_STATES
from jobwarden.store.db import Database, translate, write


def claim_gpus(db: Database, job_id: int, run: int, free: Sequence[int], count: int, now: float) -> list[int]:
    """Claim `count` of the `free` GPUs for a run, atomically against every other jobwarden job: in
    one write transaction, claims of runs that have ended are dropped first, and a GPU already
    claimed by a live run is skipped. Returns the claimed indexes, or [] (nothing claimed) when fewer
    than `count` are left."""
    live = "', '".join(sorted(UNFINISHED_STATES))
    conn = db.conn
    try:
        with write(conn):
            conn.execute(
                "DELETE FROM gpu_claims WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE "
                f"r.job_id = gpu_claims.job_id AND r.n = gpu_claims.run AND r.state IN ('{live}'))"
            )
            taken = {int(r[0]) for r in conn.execute("SELECT gpu_index FROM gpu_claims").fetchall()}
            chosen = [i for i in free if i not in taken][:count]
            if len(chosen) < count:
                return []
            conn.executemany(
                "INSERT INTO gpu_claims (gpu_index, job_id, run, claimed_at) VALUES (?,?,?,?)",
                [(i, job_id, run, now) for i in chosen],
            )
            conn.execute(
                "UPDATE runs SET gpu_ids = ? WHERE job_id = ? AND n = ?", (json.dumps(chosen), job_id, run)
            )
            return chosen
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


def release_gpus(db: Database, job_id: int, run: int) -> None:
    db.exec("DELETE FROM gpu_claims WHERE job_id = ? AND run = ?", (job_id, run))


def gpu_claims(db: Database) -> dict[int, tuple[int, int]]:
    """GPU index -> (job id, run) of every claim on record."""
    rows = db.exec("SELECT gpu_index, job_id, run FROM gpu_claims")
    return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}

"""Named queues (`run --queue NAME`, `jobwarden queue NAME --parallel N`): pueue's groups, in the store.

A run that asks for a queue stands in line (a `queue_places` row, holding 0) and takes one of the queue's
places (holding 1) when fewer than `parallel` are taken and no run of an older job still waits: first
come, first served, in the order the jobs were made. A place is the run's while the run is not over
(queued to stopping, or lost: its processes may still run); the first look at the queue after its end
gives the place back. Every decision is one write transaction, so two shims that look at once never both
take the last place.

Functions over a connection, which `Store` calls (loaded only then: not on every command's path).
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from jobwarden.model import UNFINISHED_STATES
from jobwarden.store.db import write

DEFAULT_PARALLEL = 1  # a queue nobody has set: one run at a time (pueue's default group)
_LIVE = "('" + "', '".join(sorted(UNFINISHED_STATES)) + "')"
_STALE = (
    "DELETE FROM queue_places WHERE queue = ? AND NOT EXISTS (SELECT 1 FROM runs r WHERE "
    f"r.job_id = queue_places.job_id AND r.n = queue_places.run AND r.state IN {_LIVE})"
)


class QueuePlace(NamedTuple):
    """The answer to one try: taken, or where the run stands in line and who holds the places."""

    queue: str
    taken: bool
    parallel: int
    holders: tuple[tuple[int, int], ...]  # (job id, run) of the runs holding a place
    ahead: int  # runs waiting before this one

    def describe(self) -> str:
        """'waiting for a place in queue 'gpu': 2 of 2 taken (jobs 4, 5), 1 ahead in line'."""
        if self.taken:
            return f"holds a place in queue {self.queue!r}"
        jobs = ", ".join(str(job) for job, _ in self.holders)
        held = f"{len(self.holders)} of {self.parallel} taken" + (
            f" (job{'s' if len(self.holders) > 1 else ''} {jobs})" if jobs else ""
        )
        line = f", {self.ahead} ahead in line" if self.ahead else ""
        return f"waiting for a place in queue {self.queue!r}: {held}{line}"


class QueueInfo(NamedTuple):
    name: str
    parallel: int
    running: int  # runs holding a place
    waiting: int  # runs in line

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "parallel": self.parallel,
            "running": self.running,
            "waiting": self.waiting,
        }


def take_queue_place(conn: sqlite3.Connection, queue: str, job_id: int, run: int, now: float) -> QueuePlace:
    """Stand in line for `queue`, and take a place if one is free and it is this run's turn."""
    with write(conn):
        conn.execute(_STALE, (queue,))
        conn.execute(
            "INSERT OR IGNORE INTO queue_places (queue, job_id, run, holding, since) VALUES (?,?,?,0,?)",
            (queue, job_id, run, now),
        )
        parallel = _parallel(conn, queue)
        holders = _holders(conn, queue)
        (holding,) = conn.execute(
            "SELECT holding FROM queue_places WHERE job_id = ? AND run = ?", (job_id, run)
        ).fetchone()
        (ahead,) = conn.execute(  # first come, first served: in the order the jobs were made
            "SELECT COUNT(*) FROM queue_places WHERE queue = ? AND holding = 0 AND "
            "(job_id < ? OR (job_id = ? AND run < ?))",
            (queue, job_id, job_id, run),
        ).fetchone()
        if not holding and ahead < parallel - len(holders):
            conn.execute("UPDATE queue_places SET holding = 1 WHERE job_id = ? AND run = ?", (job_id, run))
            holding = 1
            holders = (*holders, (job_id, run))
        return QueuePlace(queue, bool(holding), parallel, holders, int(ahead))


def set_queue_parallel(conn: sqlite3.Connection, queue: str, parallel: int) -> None:
    with write(conn):
        conn.execute(
            "INSERT INTO queues (name, parallel) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET parallel = excluded.parallel",
            (queue, parallel),
        )


def queues(conn: sqlite3.Connection) -> list[QueueInfo]:
    """Every queue that was set or asked for, with its places taken and its line, by name."""
    rows = conn.execute(
        "SELECT name FROM queues UNION SELECT DISTINCT queue FROM queue_places "
        "UNION SELECT DISTINCT queue FROM jobs WHERE queue IS NOT NULL ORDER BY 1"
    ).fetchall()
    return [_queue_info(conn, str(name)) for (name,) in rows]


def _queue_info(conn: sqlite3.Connection, queue: str) -> QueueInfo:
    counts = dict(
        conn.execute(
            "SELECT holding, COUNT(*) FROM queue_places q JOIN runs r ON r.job_id = q.job_id AND "
            f"r.n = q.run WHERE q.queue = ? AND r.state IN {_LIVE} GROUP BY holding",
            (queue,),
        ).fetchall()
    )
    return QueueInfo(queue, _parallel(conn, queue), int(counts.get(1, 0)), int(counts.get(0, 0)))


def _parallel(conn: sqlite3.Connection, queue: str) -> int:
    row = conn.execute("SELECT parallel FROM queues WHERE name = ?", (queue,)).fetchone()
    return int(row[0]) if row else DEFAULT_PARALLEL


def _holders(conn: sqlite3.Connection, queue: str) -> tuple[tuple[int, int], ...]:
    rows = conn.execute(
        "SELECT job_id, run FROM queue_places WHERE queue = ? AND holding = 1 ORDER BY job_id, run",
        (queue,),
    ).fetchall()
    return tuple((int(j), int(r)) for j, r in rows)

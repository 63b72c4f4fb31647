"""Jobs and their runs: making them (with their directories), finding them by any JOB argument, updating a
run's state, forgetting them. Functions over the store's `Database` (store/db.py); `Store` delegates."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from jobwarden.errors import JobNotFound, StoreError
from jobwarden.model import UNFINISHED_STATES, JobSpec, JobState
from jobwarden.paths import ensure_private_dir
from jobwarden.store.db import Database, translate, write
from jobwarden.store.fingerprints import forget_unused_package_sets
from jobwarden.store.records import JobRecord, RunRecord

_RUN_COLUMNS = frozenset(
    {
        "state",
        "shim_pid",
        "shim_start",
        "pid",
        "pid_start",
        "started_at",
        "ended_at",
        "exit_code",
        "signal",
        "wait_status",
        "end_reason",
        "error",
        "stop_requested_at",
        "stop_grace",
        "containment",
        "orphans_left",
        "survivors",
        "queued_reason",
        "gpu_ids",
        "mem_peak_bytes",
        "verdict_rule",
        "verdict_title",
        "boot_id",
        "kept",
    }
)

_MAX_ID = (1 << 63) - 1  # SQLite's INTEGER: a larger number names no job and no run
# every table holding a job's rows, the job's own last (the others refer to it)
_JOB_TABLES = (
    "fingerprints",
    "queue_places",
    "gpu_claims",
    "stacks",
    "findings",
    "progress",
    "samples_rollup",
    "samples",
    "processes",
    "events",
    "runs",
    "jobs",
)
LAST_JOB = "@last"  # a JOB argument naming the newest job (no name can be it: names never start with @)


# --- jobs -----------------------------------------------------------------------------------------


def create_job(
    db: Database,
    spec: JobSpec,
    options: dict[str, Any],
    now: float,
    state: JobState = JobState.STARTING,
    rerun_of: int | None = None,
) -> tuple[int, int]:
    """A new job with its first run; returns (job id, run number). The run directory is made too. Should
    anything fail or be interrupted (Ctrl-C) once the rows are written, they are removed: nothing will
    start the job, and no ghost may be left `starting`. `rerun_of`: the job it repeats (`rerun`)."""
    conn = db.conn
    job_id = 0
    try:
        with write(conn):
            cur = conn.execute(
                "INSERT INTO jobs (id, name, command, cwd, env, options, created_at, rerun_of, queue) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    _unused_job_id(db),
                    spec.name,
                    json.dumps(spec.command),
                    _path_value(spec.cwd),
                    json.dumps(spec.env),
                    json.dumps(options),
                    now,
                    rerun_of,
                    options.get("queue"),
                ),
            )
            job_id = int(cur.lastrowid or 0)
            conn.execute("INSERT INTO runs (job_id, n, state) VALUES (?, 1, ?)", (job_id, state))
            if options.get("queue") and not options.get("after"):
                # in line from the moment it exists: a job made later never passes it, however soon
                # its own shim looks (one waiting for --after joins the line once it may start)
                conn.execute(
                    "INSERT INTO queue_places (queue, job_id, run, holding, since) VALUES (?,?,1,0,?)",
                    (options["queue"], job_id, now),
                )
            conn.execute(
                "INSERT INTO events (job_id, run, at, kind) VALUES (?, 1, ?, 'created')", (job_id, now)
            )
        make_run_dir(db, job_id, 1)
    except BaseException as err:
        if job_id:
            with contextlib.suppress(StoreError):  # the first error is the one to report
                delete_jobs(db, [job_id])
        if isinstance(err, sqlite3.Error):
            raise translate(err, db.layout.database) from err
        raise
    return job_id, 1


def _unused_job_id(db: Database) -> int:
    """The next id, past every job folder already on disk. A database emptied or moved aside (the
    advice for a corrupt one) starts counting at 1 again: job 1 would then append to the old job 1's
    log, `rm` would delete it, and the old job's shim would take the new job's processes, marked
    with the same id, for its own."""
    row = db.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
    candidate = int(row[0]) + 1 if row else 1
    if not os.path.lexists(db.layout.job_dir(candidate)):
        return candidate
    try:
        names = os.listdir(db.layout.jobs_dir)
    except OSError:
        names = []
    return max([candidate, *(int(n) + 1 for n in names if n.isascii() and n.isdigit())])


def make_run_dir(db: Database, job_id: int, run: int) -> Path:
    layout = db.layout
    ensure_private_dir(layout.jobs_dir)
    ensure_private_dir(layout.job_dir(job_id))
    return ensure_private_dir(layout.run_dir(job_id, run))


def job(db: Database, ref: str | int) -> JobRecord:
    """A job by id, by name (the newest job of that name), or `@last` (the newest job of all): the one
    place every JOB argument is resolved."""
    text = str(ref)
    if not _encodable(text):  # bytes that are not UTF-8 (os.fsdecode's surrogates): no name holds them
        raise JobNotFound(text)
    row = None
    if text == LAST_JOB:
        row = db.exec("SELECT * FROM jobs ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            raise JobNotFound(text)
    # '²'.isdigit() is True; and 5,000 digits are past what int() converts (a ValueError)
    elif text.isascii() and text.isdigit() and len(text) <= len(str(_MAX_ID)) and int(text) <= _MAX_ID:
        row = db.exec("SELECT * FROM jobs WHERE id = ?", (int(text),)).fetchone()
    if row is None:
        row = db.exec("SELECT * FROM jobs WHERE name = ? ORDER BY id DESC LIMIT 1", (text,)).fetchone()
    if row is None:
        raise JobNotFound(text)
    return JobRecord.from_row(row)


def unfinished_namesakes(db: Database, name: str, job_id: int) -> list[int]:
    """Ids of the other jobs named `name` that are not over (their latest run active or lost), oldest
    first: a name shared by two live jobs means only the newest of them (`job`)."""
    live = ", ".join("?" * len(UNFINISHED_STATES))
    rows = db.exec(
        "SELECT j.id FROM jobs j JOIN runs r ON r.job_id = j.id AND r.n = "
        "(SELECT MAX(m.n) FROM runs m WHERE m.job_id = j.id) "
        f"WHERE j.name = ? AND j.id != ? AND r.state IN ({live}) ORDER BY j.id",
        (name, job_id, *sorted(UNFINISHED_STATES)),
    )
    return [int(r[0]) for r in rows]


def job_refs(db: Database, limit: int = 500) -> list[tuple[int, str]]:
    """(id, name) of the newest jobs, newest first: what a shell completion offers."""
    rows = db.exec("SELECT id, name FROM jobs ORDER BY id DESC LIMIT ?", (limit,))
    return [(int(r["id"]), str(r["name"])) for r in rows]


def jobs(db: Database) -> list[JobRecord]:
    return [JobRecord.from_row(r) for r in db.exec("SELECT * FROM jobs ORDER BY id")]


def delete_jobs(db: Database, job_ids: Sequence[int]) -> None:
    """Forget jobs and everything recorded of them, in one transaction."""
    try:
        with write(db.conn):
            for job_id in job_ids:
                for table in _JOB_TABLES:
                    column = "id" if table == "jobs" else "job_id"
                    db.conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))
            forget_unused_package_sets(db.conn)
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


# --- runs -----------------------------------------------------------------------------------------


def run(db: Database, job_id: int, n: int | None = None) -> RunRecord:
    """Run `n` of a job, or its latest."""
    if n is None:
        row = db.exec("SELECT * FROM runs WHERE job_id = ? ORDER BY n DESC LIMIT 1", (job_id,)).fetchone()
    elif not 0 < n <= _MAX_ID:
        row = None
    else:
        row = db.exec("SELECT * FROM runs WHERE job_id = ? AND n = ?", (job_id, n)).fetchone()
    if row is None:
        raise JobNotFound(f"{job_id}" + (f" run {n}" if n else ""))
    return RunRecord.from_row(row)


def runs(db: Database, job_id: int) -> list[RunRecord]:
    """Every attempt of a job, first to last."""
    rows = db.exec("SELECT * FROM runs WHERE job_id = ? ORDER BY n", (job_id,))
    return [RunRecord.from_row(r) for r in rows]


def new_run(db: Database, job_id: int, state: JobState, now: float) -> int:
    """The next attempt of a job (a restart); returns its number. The run directory is made too."""
    n = _insert_run(db, job_id, state, now, after=None)
    assert n is not None  # no condition to fail
    return n


def new_run_after(db: Database, job_id: int, after: int, state: JobState, now: float) -> int | None:
    """The next attempt of a job only while run `after` is still its latest: a compare-and-set, so
    that of two commands starting the job again at once (`jobwarden resume` twice) one starts it and
    the other finds it started. None when another run came first."""
    return _insert_run(db, job_id, state, now, after=after)


def _insert_run(db: Database, job_id: int, state: JobState, now: float, after: int | None) -> int | None:
    conn = db.conn
    try:
        with write(conn):  # BEGIN IMMEDIATE: the look and the insert under one write lock
            row = conn.execute("SELECT MAX(n) FROM runs WHERE job_id = ?", (job_id,)).fetchone()
            latest = int(row[0] or 0)
            if after is not None and latest != after:
                return None
            n = latest + 1
            conn.execute("INSERT INTO runs (job_id, n, state) VALUES (?, ?, ?)", (job_id, n, state))
            conn.execute(
                "INSERT INTO events (job_id, run, at, kind) VALUES (?, ?, ?, 'created')", (job_id, n, now)
            )
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err
    make_run_dir(db, job_id, n)
    return n


def latest_runs(db: Database) -> dict[int, RunRecord]:
    rows = db.exec(
        "SELECT r.* FROM runs r JOIN (SELECT job_id, MAX(n) AS n FROM runs GROUP BY job_id) "
        "m ON r.job_id = m.job_id AND r.n = m.n"
    )
    return {r["job_id"]: RunRecord.from_row(r) for r in rows}


def update_run(
    db: Database, job_id: int, n: int, *, only_if_state: Iterable[JobState] | None = None, **fields: Any
) -> bool:
    """Set fields of a run; with `only_if_state`, only while the run is in one of those states (a
    compare-and-set, so a CLI marking a run lost never overwrites the end a shim just recorded)."""
    sql, params = _run_update(job_id, n, only_if_state, fields)
    try:
        with write(db.conn):
            return db.conn.execute(sql, params).rowcount > 0
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


def update_run_with_event(
    db: Database,
    job_id: int,
    n: int,
    kind: str,
    at: float,
    data: dict[str, Any],
    *,
    only_if_state: Iterable[JobState] | None = None,
    **fields: Any,
) -> bool:
    """`update_run` and an event (store/events.py) in one transaction: one commit instead of two (the
    shim's start is on the latency of `run`), and no reader sees the new state without the event that
    explains it. The event is recorded only if the update applied."""
    sql, params = _run_update(job_id, n, only_if_state, fields)
    try:
        with write(db.conn):
            if db.conn.execute(sql, params).rowcount == 0:
                return False
            db.conn.execute(
                "INSERT INTO events (job_id, run, at, kind, data) VALUES (?,?,?,?,?)",
                (job_id, n, at, kind, json.dumps(data)),
            )
            return True
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


def _run_update(
    job_id: int, n: int, only_if_state: Iterable[JobState] | None, fields: dict[str, Any]
) -> tuple[str, list[Any]]:
    unknown = set(fields) - _RUN_COLUMNS
    if unknown:
        raise ValueError(f"unknown run fields {unknown}")
    values = [json.dumps(v) if isinstance(v, list | tuple | dict) else v for v in fields.values()]
    sql = f"UPDATE runs SET {', '.join(f'{k} = ?' for k in fields)} WHERE job_id = ? AND n = ?"
    params = [*values, job_id, n]
    if only_if_state is not None:
        states = list(only_if_state)
        sql += f" AND state IN ({', '.join('?' * len(states))})"
        params += states
    return sql, params


def _path_value(path: str) -> str | bytes:
    """A path as SQLite can hold it: text, or its raw bytes where it is not UTF-8 (a directory name from
    another locale reaches Python as lone surrogates, which SQLite's text refuses)."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True

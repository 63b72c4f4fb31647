"""The store's interface: every read and write of jobs, runs, processes and events goes through `Store`.

Kept narrow on purpose, so a server database can stand behind it later.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from jobwarden.errors import JobNotFound
from jobwarden.model import JobSpec, JobState, ProcessSnapshot
from jobwarden.paths import Layout, ensure_private_dir
from jobwarden.store.db import connect, translate, write
from jobwarden.store.records import Event, JobRecord, ProcessRecord, RunRecord

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
    }
)


class Store:
    def __init__(self, home: Path) -> None:
        self.layout = Layout(ensure_private_dir(home))
        self._conn = connect(self.layout.database)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    # --- jobs -------------------------------------------------------------------------------------

    def create_job(
        self, spec: JobSpec, options: dict[str, Any], now: float, state: JobState = JobState.STARTING
    ) -> tuple[int, int]:
        """A new job with its first run; returns (job id, run number). The run directory is made too."""
        try:
            with write(self._conn):
                cur = self._conn.execute(
                    "INSERT INTO jobs (name, command, cwd, env, options, created_at) VALUES (?,?,?,?,?,?)",
                    (
                        spec.name,
                        json.dumps(spec.command),
                        spec.cwd,
                        json.dumps(spec.env),
                        json.dumps(options),
                        now,
                    ),
                )
                job_id = int(cur.lastrowid or 0)
                self._conn.execute("INSERT INTO runs (job_id, n, state) VALUES (?, 1, ?)", (job_id, state))
                self._conn.execute(
                    "INSERT INTO events (job_id, run, at, kind) VALUES (?, 1, ?, 'created')", (job_id, now)
                )
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err
        self.make_run_dir(job_id, 1)
        return job_id, 1

    def make_run_dir(self, job_id: int, run: int) -> Path:
        ensure_private_dir(self.layout.job_dir(job_id))
        return ensure_private_dir(self.layout.run_dir(job_id, run))

    def job(self, ref: str | int) -> JobRecord:
        """A job by id, or by name (the newest job of that name)."""
        text = str(ref)
        row = None
        if text.isascii() and text.isdigit():  # '²'.isdigit() is True, int('²') fails
            row = self._exec("SELECT * FROM jobs WHERE id = ?", (int(text),)).fetchone()
        if row is None:
            row = self._exec("SELECT * FROM jobs WHERE name = ? ORDER BY id DESC LIMIT 1", (text,)).fetchone()
        if row is None:
            raise JobNotFound(text)
        return JobRecord.from_row(row)

    def jobs(self) -> list[JobRecord]:
        return [JobRecord.from_row(r) for r in self._exec("SELECT * FROM jobs ORDER BY id")]

    def delete_job(self, job_id: int) -> None:
        try:
            with write(self._conn):
                for table in ("findings", "samples", "processes", "events", "runs", "jobs"):
                    column = "id" if table == "jobs" else "job_id"
                    self._conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    # --- runs -------------------------------------------------------------------------------------

    def run(self, job_id: int, n: int | None = None) -> RunRecord:
        """Run `n` of a job, or its latest."""
        if n is None:
            row = self._exec(
                "SELECT * FROM runs WHERE job_id = ? ORDER BY n DESC LIMIT 1", (job_id,)
            ).fetchone()
        else:
            row = self._exec("SELECT * FROM runs WHERE job_id = ? AND n = ?", (job_id, n)).fetchone()
        if row is None:
            raise JobNotFound(f"{job_id}" + (f" run {n}" if n else ""))
        return RunRecord.from_row(row)

    def latest_runs(self) -> dict[int, RunRecord]:
        rows = self._exec(
            "SELECT r.* FROM runs r JOIN (SELECT job_id, MAX(n) AS n FROM runs GROUP BY job_id) "
            "m ON r.job_id = m.job_id AND r.n = m.n"
        )
        return {r["job_id"]: RunRecord.from_row(r) for r in rows}

    def update_run(
        self, job_id: int, n: int, *, only_if_state: Iterable[JobState] | None = None, **fields: Any
    ) -> bool:
        """Set fields of a run; with `only_if_state`, only while the run is in one of those states (a
        compare-and-set, so a CLI marking a run lost never overwrites the end a shim just recorded)."""
        unknown = set(fields) - _RUN_COLUMNS
        if unknown:
            raise ValueError(f"unknown run fields {unknown}")
        values = [json.dumps(v) if isinstance(v, list | dict) else v for v in fields.values()]
        sql = f"UPDATE runs SET {', '.join(f'{k} = ?' for k in fields)} WHERE job_id = ? AND n = ?"
        params = [*values, job_id, n]
        if only_if_state is not None:
            states = list(only_if_state)
            sql += f" AND state IN ({', '.join('?' * len(states))})"
            params += states
        try:
            with write(self._conn):
                return self._conn.execute(sql, params).rowcount > 0
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    # --- events -----------------------------------------------------------------------------------

    def add_event(self, job_id: int, run: int | None, kind: str, at: float, **data: Any) -> None:
        self._exec(
            "INSERT INTO events (job_id, run, at, kind, data) VALUES (?,?,?,?,?)",
            (job_id, run, at, kind, json.dumps(data)),
        )

    def events(self, job_id: int, run: int | None = None) -> list[Event]:
        sql, params = "SELECT * FROM events WHERE job_id = ?", [job_id]
        if run is not None:
            sql += " AND run = ?"
            params.append(run)
        return [
            Event(r["at"], r["run"], r["kind"], json.loads(r["data"]))
            for r in self._exec(sql + " ORDER BY id", params)
        ]

    # --- processes and samples --------------------------------------------------------------------

    def record_tree(
        self,
        job_id: int,
        run: int,
        now: float,
        live: Sequence[ProcessSnapshot],
        ended: Sequence[tuple[int, int, int | None]],
    ) -> None:
        """One tick of the shim in one transaction: the live processes, those that ended
        [(pid, start_time, wait status or None)], and the run's totals as a sample."""
        try:
            with write(self._conn):
                self._conn.executemany(
                    "INSERT INTO processes (job_id, run, pid, start_time, ppid, cmdline, state, rss_bytes, "
                    "cpu_percent, first_seen) VALUES (?,?,?,?,?,?,?,?,?,?) "
                    "ON CONFLICT (job_id, run, pid, start_time) DO UPDATE SET ppid = excluded.ppid, "
                    "state = excluded.state, rss_bytes = excluded.rss_bytes, "
                    "cpu_percent = excluded.cpu_percent",
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
                        )
                        for p in live
                    ],
                )
                self._conn.executemany(
                    "UPDATE processes SET ended_at = ?, wait_status = ?, state = 'X' "
                    "WHERE job_id = ? AND run = ? AND pid = ? AND start_time = ? AND ended_at IS NULL",
                    [(now, status, job_id, run, pid, start) for pid, start, status in ended],
                )
                if live:
                    self._conn.execute(
                        "INSERT INTO samples (job_id, run, at, nprocs, cpu_percent, rss_bytes) "
                        "VALUES (?,?,?,?,?,?)",
                        (
                            job_id,
                            run,
                            now,
                            len(live),
                            sum(p.cpu_percent or 0.0 for p in live),
                            sum(p.rss_bytes for p in live),
                        ),
                    )
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def processes(self, job_id: int, run: int, live_only: bool = False) -> list[ProcessRecord]:
        sql = "SELECT * FROM processes WHERE job_id = ? AND run = ?"
        if live_only:
            sql += " AND ended_at IS NULL"
        return [
            ProcessRecord.from_row(r) for r in self._exec(sql + " ORDER BY first_seen, pid", (job_id, run))
        ]

    def latest_sample(self, job_id: int, run: int) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._exec(
            "SELECT * FROM samples WHERE job_id = ? AND run = ? ORDER BY at DESC LIMIT 1", (job_id, run)
        ).fetchone()
        return row

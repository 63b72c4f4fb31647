"""The store's interface: every read and write of jobs, runs, processes and events goes through `Store`.

Kept narrow on purpose, so a server database can stand behind it later.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from jobwarden import trace
from jobwarden.errors import JobNotFound, StoreError
from jobwarden.model import UNFINISHED_STATES, Finding, JobSpec, JobState, ProcessEnd, ProcessSnapshot, Ranks
from jobwarden.paths import Layout, ensure_private_dir
from jobwarden.store import samples
from jobwarden.store.db import BUSY_TIMEOUT_S, connect, store_id, translate, wal_identity, write
from jobwarden.store.fingerprints import FingerprintMethods
from jobwarden.store.listing import ListQueries
from jobwarden.store.progress import ProgressMethods
from jobwarden.store.records import Event, JobRecord, ProcessRecord, RunRecord, StackDump
from jobwarden.store.rollup import Bucket, Reading
from jobwarden.store.samples import SampleMethods

if TYPE_CHECKING:  # diagnosis types: not on the `run` path
    from jobwarden.observations import ProcessStack
    from jobwarden.store.queues import QueueInfo, QueuePlace

T = TypeVar("T")

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


class Store(SampleMethods, ListQueries, ProgressMethods, FingerprintMethods):
    def __init__(self, home: Path) -> None:
        self.layout = Layout(ensure_private_dir(home))
        if self.layout.database_place.moved:  # the home is on a network file system: WAL needs local disk
            ensure_private_dir(self.layout.database.parent.parent)
            ensure_private_dir(self.layout.database.parent)
        trace.debug(f"store: {self.layout.database}")
        self._conn = connect(self.layout.database)
        self._store_id: str | None = None
        self._wal = wal_identity(self.layout.database)  # the log this connection writes to
        self._file = _file_identity(self.layout.database)  # and the database file itself
        self._malformed = set()

    def close(self) -> None:
        self._conn.close()

    def reopen_if_wal_replaced(self) -> bool:
        """For a long-lived connection (a shim's): True when the write-ahead log it writes to is no longer
        the one on disk (deleted, or deleted and made again): its writes would reach no other process,
        and no new connection can open the database while it holds the deleted one. It is closed (the
        last holder to close writes the log back into the database) and opened again."""
        now = wal_identity(self.layout.database)
        if now == self._wal:
            return False
        if _file_identity(self.layout.database) != self._file:
            # the database itself was moved aside (or replaced): a new one there is another store, whose
            # job ids start over; this connection stays with its own (moved) file, never writes there
            return False
        self._conn.close()
        self._conn = connect(self.layout.database)
        self._wal = wal_identity(self.layout.database)
        return True

    @property
    def store_id(self) -> str:
        """This database's identity (store.db.store_id), read once."""
        if self._store_id is None:
            try:
                self._store_id = store_id(self._conn)
            except sqlite3.Error as err:
                raise translate(err, self.layout.database) from err
        return self._store_id

    @contextlib.contextmanager
    def waiting_at_most(self, seconds: float) -> Iterator[None]:
        """Writes inside wait this long for another process's write lock, then raise StoreBusy (the
        shim's loop must go on watching: what it cannot write now, it writes later, with its own time)."""
        self._conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
        try:
            yield
        finally:
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

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
        self,
        spec: JobSpec,
        options: dict[str, Any],
        now: float,
        state: JobState = JobState.STARTING,
        rerun_of: int | None = None,
    ) -> tuple[int, int]:
        """A new job with its first run; returns (job id, run number). The run directory is made too. Should
        anything fail or be interrupted (Ctrl-C) once the rows are written, they are removed: nothing will
        start the job, and no ghost may be left `starting`. `rerun_of`: the job it repeats (`rerun`)."""
        job_id = 0
        try:
            with write(self._conn):
                cur = self._conn.execute(
                    "INSERT INTO jobs (id, name, command, cwd, env, options, created_at, rerun_of, queue) "
                    "VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        self._unused_job_id(),
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
                self._conn.execute("INSERT INTO runs (job_id, n, state) VALUES (?, 1, ?)", (job_id, state))
                if options.get("queue") and not options.get("after"):
                    # in line from the moment it exists: a job made later never passes it, however soon
                    # its own shim looks (one waiting for --after joins the line once it may start)
                    self._conn.execute(
                        "INSERT INTO queue_places (queue, job_id, run, holding, since) VALUES (?,?,1,0,?)",
                        (options["queue"], job_id, now),
                    )
                self._conn.execute(
                    "INSERT INTO events (job_id, run, at, kind) VALUES (?, 1, ?, 'created')", (job_id, now)
                )
            self.make_run_dir(job_id, 1)
        except BaseException as err:
            if job_id:
                with contextlib.suppress(StoreError):  # the first error is the one to report
                    self.delete_job(job_id)
            if isinstance(err, sqlite3.Error):
                raise translate(err, self.layout.database) from err
            raise
        return job_id, 1

    def _unused_job_id(self) -> int:
        """The next id, past every job folder already on disk. A database emptied or moved aside (the
        advice for a corrupt one) starts counting at 1 again: job 1 would then append to the old job 1's
        log, `rm` would delete it, and the old job's shim would take the new job's processes, marked
        with the same id, for its own."""
        row = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        candidate = int(row[0]) + 1 if row else 1
        if not os.path.lexists(self.layout.job_dir(candidate)):
            return candidate
        try:
            names = os.listdir(self.layout.jobs_dir)
        except OSError:
            names = []
        return max([candidate, *(int(n) + 1 for n in names if n.isascii() and n.isdigit())])

    def make_run_dir(self, job_id: int, run: int) -> Path:
        ensure_private_dir(self.layout.jobs_dir)
        ensure_private_dir(self.layout.job_dir(job_id))
        return ensure_private_dir(self.layout.run_dir(job_id, run))

    def job(self, ref: str | int) -> JobRecord:
        """A job by id, by name (the newest job of that name), or `@last` (the newest job of all): the one
        place every JOB argument is resolved."""
        text = str(ref)
        if not _encodable(text):  # bytes that are not UTF-8 (os.fsdecode's surrogates): no name holds them
            raise JobNotFound(text)
        row = None
        if text == LAST_JOB:
            row = self._exec("SELECT * FROM jobs ORDER BY id DESC LIMIT 1").fetchone()
            if row is None:
                raise JobNotFound(text)
        # '²'.isdigit() is True; and 5,000 digits are past what int() converts (a ValueError)
        elif text.isascii() and text.isdigit() and len(text) <= len(str(_MAX_ID)) and int(text) <= _MAX_ID:
            row = self._exec("SELECT * FROM jobs WHERE id = ?", (int(text),)).fetchone()
        if row is None:
            row = self._exec("SELECT * FROM jobs WHERE name = ? ORDER BY id DESC LIMIT 1", (text,)).fetchone()
        if row is None:
            raise JobNotFound(text)
        return JobRecord.from_row(row)

    def unfinished_namesakes(self, name: str, job_id: int) -> list[int]:
        """Ids of the other jobs named `name` that are not over (their latest run active or lost), oldest
        first: a name shared by two live jobs means only the newest of them (`Store.job`)."""
        live = ", ".join("?" * len(UNFINISHED_STATES))
        rows = self._exec(
            "SELECT j.id FROM jobs j JOIN runs r ON r.job_id = j.id AND r.n = "
            "(SELECT MAX(m.n) FROM runs m WHERE m.job_id = j.id) "
            f"WHERE j.name = ? AND j.id != ? AND r.state IN ({live}) ORDER BY j.id",
            (name, job_id, *sorted(UNFINISHED_STATES)),
        )
        return [int(r[0]) for r in rows]

    def job_refs(self, limit: int = 500) -> list[tuple[int, str]]:
        """(id, name) of the newest jobs, newest first: what a shell completion offers."""
        rows = self._exec("SELECT id, name FROM jobs ORDER BY id DESC LIMIT ?", (limit,))
        return [(int(r["id"]), str(r["name"])) for r in rows]

    def jobs(self) -> list[JobRecord]:
        return [JobRecord.from_row(r) for r in self._exec("SELECT * FROM jobs ORDER BY id")]

    def delete_job(self, job_id: int) -> None:
        self.delete_jobs([job_id])

    def delete_jobs(self, job_ids: Sequence[int]) -> None:
        """Forget jobs and everything recorded of them, in one transaction."""
        try:
            with write(self._conn):
                for job_id in job_ids:
                    self._delete_rows(job_id)
                self.forget_unused_package_sets()
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def _delete_rows(self, job_id: int) -> None:
        for table in _JOB_TABLES:
            column = "id" if table == "jobs" else "job_id"
            self._conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))

    # --- runs -------------------------------------------------------------------------------------

    def run(self, job_id: int, n: int | None = None) -> RunRecord:
        """Run `n` of a job, or its latest."""
        if n is None:
            row = self._exec(
                "SELECT * FROM runs WHERE job_id = ? ORDER BY n DESC LIMIT 1", (job_id,)
            ).fetchone()
        elif not 0 < n <= _MAX_ID:
            row = None
        else:
            row = self._exec("SELECT * FROM runs WHERE job_id = ? AND n = ?", (job_id, n)).fetchone()
        if row is None:
            raise JobNotFound(f"{job_id}" + (f" run {n}" if n else ""))
        return RunRecord.from_row(row)

    def runs(self, job_id: int) -> list[RunRecord]:
        """Every attempt of a job, first to last."""
        rows = self._exec("SELECT * FROM runs WHERE job_id = ? ORDER BY n", (job_id,))
        return [RunRecord.from_row(r) for r in rows]

    def new_run(self, job_id: int, state: JobState, now: float) -> int:
        """The next attempt of a job (a restart); returns its number. The run directory is made too."""
        n = self._insert_run(job_id, state, now, after=None)
        assert n is not None  # no condition to fail
        return n

    def new_run_after(self, job_id: int, after: int, state: JobState, now: float) -> int | None:
        """The next attempt of a job only while run `after` is still its latest: a compare-and-set, so
        that of two commands starting the job again at once (`jobwarden resume` twice) one starts it and
        the other finds it started. None when another run came first."""
        return self._insert_run(job_id, state, now, after=after)

    def _insert_run(self, job_id: int, state: JobState, now: float, after: int | None) -> int | None:
        try:
            with write(self._conn):  # BEGIN IMMEDIATE: the look and the insert under one write lock
                row = self._conn.execute("SELECT MAX(n) FROM runs WHERE job_id = ?", (job_id,)).fetchone()
                latest = int(row[0] or 0)
                if after is not None and latest != after:
                    return None
                n = latest + 1
                self._conn.execute("INSERT INTO runs (job_id, n, state) VALUES (?, ?, ?)", (job_id, n, state))
                self._conn.execute(
                    "INSERT INTO events (job_id, run, at, kind) VALUES (?, ?, ?, 'created')", (job_id, n, now)
                )
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err
        self.make_run_dir(job_id, n)
        return n

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
        sql, params = _run_update(job_id, n, only_if_state, fields)
        try:
            with write(self._conn):
                return self._conn.execute(sql, params).rowcount > 0
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def update_run_with_event(
        self,
        job_id: int,
        n: int,
        kind: str,
        at: float,
        data: dict[str, Any],
        *,
        only_if_state: Iterable[JobState] | None = None,
        **fields: Any,
    ) -> bool:
        """`update_run` and `add_event` in one transaction: one commit instead of two (the shim's start
        is on the latency of `run`), and no reader sees the new state without the event that explains it.
        The event is recorded only if the update applied."""
        sql, params = _run_update(job_id, n, only_if_state, fields)
        try:
            with write(self._conn):
                if self._conn.execute(sql, params).rowcount == 0:
                    return False
                self._conn.execute(
                    "INSERT INTO events (job_id, run, at, kind, data) VALUES (?,?,?,?,?)",
                    (job_id, n, at, kind, json.dumps(data)),
                )
                return True
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
        ended: Sequence[ProcessEnd],
        sample: Reading | None = None,
        rollups: Sequence[Bucket] = (),
    ) -> None:
        """One tick of the shim in one transaction: the live processes, those that ended, the run's totals
        as a sample (`sample`, else the sums of `live`) and the downsampled points that closed. An ended
        process the shim never saw alive (it died within milliseconds, and only the kernel's process
        events or its reaping parent told of it) gets its row here."""
        try:
            with write(self._conn):
                self._conn.executemany(
                    "INSERT INTO processes (job_id, run, pid, start_time, ppid, cmdline, state, rss_bytes, "
                    "cpu_percent, first_seen, gpu_memory_bytes, rank, local_rank, group_rank) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                    "ON CONFLICT (job_id, run, pid, start_time) DO UPDATE SET ppid = excluded.ppid, "
                    "state = excluded.state, rss_bytes = excluded.rss_bytes, "
                    "cpu_percent = excluded.cpu_percent, gpu_memory_bytes = excluded.gpu_memory_bytes",
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
                self._conn.executemany(
                    "INSERT INTO processes (job_id, run, pid, start_time, ppid, cmdline, state, first_seen, "
                    "ended_at, wait_status, rank, local_rank, group_rank) "
                    "VALUES (?,?,?,?,?,?,'X',?,?,?,?,?,?) "
                    "ON CONFLICT (job_id, run, pid, start_time) DO UPDATE SET state = 'X', "
                    "ended_at = COALESCE(processes.ended_at, excluded.ended_at), "
                    "wait_status = COALESCE(processes.wait_status, excluded.wait_status)",
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
                    samples.insert_readings(self._conn, job_id, run, [sample])
                samples.insert_buckets(self._conn, job_id, run, rollups)
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
        """The newest well-formed raw sample (a malformed one is skipped and counted, the one before it
        read instead: a few at most)."""
        rows = self._exec(
            "SELECT * FROM samples WHERE job_id = ? AND run = ? ORDER BY at DESC LIMIT 8", (job_id, run)
        )
        for row in rows:
            try:
                return samples.checked_sample(row)
            except samples.Malformed:
                self._malformed.add(samples.row_key(row))
        return None

    # --- findings and stack dumps -----------------------------------------------------------------

    def add_finding(self, job_id: int, run: int, at: float, finding: Finding) -> None:
        """Record a finding the shim concluded while the run is live."""
        self._exec(
            "INSERT INTO findings (job_id, run, at, rule, body) VALUES (?,?,?,?,?)",
            (job_id, run, at, finding.rule, _finding_body(finding, at)),
        )

    def resolve_finding(self, job_id: int, run: int, finding: Finding, at: float) -> None:
        """`finding`, recorded at `finding.at`, stopped being true at `at` (the process resumed, progress
        came back). Named by its moment and body, not a row id: the shim's writer may have deferred the
        insert while another process held the lock. Once: a later call leaves the first moment."""
        if finding.at is None:
            raise ValueError("a finding is resolved by the moment it was recorded at")
        self._exec(
            "UPDATE findings SET resolved_at = ? WHERE job_id = ? AND run = ? AND at = ? AND body = ? "
            "AND resolved_at IS NULL",
            (at, job_id, run, finding.at, _finding_body(finding, finding.at)),
        )

    def update_finding(self, job_id: int, run: int, finding: Finding, latest: Finding) -> None:
        """`finding`, recorded at `finding.at` and still current, is now as `latest` says (a speed finding's
        figures move while it stays true: "3.0x" becomes "3.4x"). Named like resolve_finding, by its moment
        and body; it keeps its moment. A resolved finding keeps the text it had when it stopped being true."""
        if finding.at is None:
            raise ValueError("a finding is updated by the moment it was recorded at")
        self._exec(
            "UPDATE findings SET body = ? WHERE job_id = ? AND run = ? AND at = ? AND body = ? "
            "AND resolved_at IS NULL",
            (
                _finding_body(latest, finding.at),
                job_id,
                run,
                finding.at,
                _finding_body(finding, finding.at),
            ),
        )

    def findings(self, job_id: int, run: int) -> list[tuple[float, Finding]]:
        """Findings the shim recorded while the run was live (hangs, lost workers), oldest first, each with
        when it was found and, once it stopped being true, when that was."""
        rows = self._exec(
            "SELECT at, resolved_at, body FROM findings WHERE job_id = ? AND run = ? ORDER BY at, rowid",
            (job_id, run),
        )
        return [
            (
                r["at"],
                Finding.from_json(json.loads(r["body"]))._replace(at=r["at"], resolved_at=r["resolved_at"]),
            )
            for r in rows
        ]

    def add_stacks(
        self, job_id: int, run: int, at: float, trigger: str, stacks: Sequence[ProcessStack]
    ) -> int:
        cur = self._exec(
            "INSERT INTO stacks (job_id, run, at, trigger, body) VALUES (?,?,?,?,?)",
            (job_id, run, at, trigger, json.dumps([s.to_json() for s in stacks])),
        )
        return int(cur.lastrowid or 0)

    def stacks(self, job_id: int, run: int) -> list[StackDump]:
        rows = self._exec("SELECT * FROM stacks WHERE job_id = ? AND run = ? ORDER BY at, id", (job_id, run))
        return [StackDump.from_row(r) for r in rows]

    # --- queues (store.queues: loaded by those who use them) ----------------------------------------

    def take_queue_place(self, queue: str, job_id: int, run: int, now: float) -> QueuePlace:
        from jobwarden.store import queues

        return self._translated(lambda: queues.take_queue_place(self._conn, queue, job_id, run, now))

    def set_queue_parallel(self, queue: str, parallel: int) -> None:
        from jobwarden.store import queues

        self._translated(lambda: queues.set_queue_parallel(self._conn, queue, parallel))

    def queues(self) -> list[QueueInfo]:
        from jobwarden.store import queues

        return self._translated(lambda: queues.queues(self._conn))

    def _translated(self, query: Callable[[], T]) -> T:
        try:
            return query()
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    # --- GPU claims -------------------------------------------------------------------------------

    def claim_gpus(self, job_id: int, run: int, free: Sequence[int], count: int, now: float) -> list[int]:
        """Claim `count` of the `free` GPUs for a run, atomically against every other jobwarden job: in
        one write transaction, claims of runs that have ended are dropped first, and a GPU already
        claimed by a live run is skipped. Returns the claimed indexes, or [] (nothing claimed) when fewer
        than `count` are left."""
        live = "', '".join(sorted(UNFINISHED_STATES))
        try:
            with write(self._conn):
                self._conn.execute(
                    "DELETE FROM gpu_claims WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE "
                    f"r.job_id = gpu_claims.job_id AND r.n = gpu_claims.run AND r.state IN ('{live}'))"
                )
                taken = {int(r[0]) for r in self._conn.execute("SELECT gpu_index FROM gpu_claims").fetchall()}
                chosen = [i for i in free if i not in taken][:count]
                if len(chosen) < count:
                    return []
                self._conn.executemany(
                    "INSERT INTO gpu_claims (gpu_index, job_id, run, claimed_at) VALUES (?,?,?,?)",
                    [(i, job_id, run, now) for i in chosen],
                )
                self._conn.execute(
                    "UPDATE runs SET gpu_ids = ? WHERE job_id = ? AND n = ?",
                    (json.dumps(chosen), job_id, run),
                )
                return chosen
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def release_gpus(self, job_id: int, run: int) -> None:
        self._exec("DELETE FROM gpu_claims WHERE job_id = ? AND run = ?", (job_id, run))

    def gpu_claims(self) -> dict[int, tuple[int, int]]:
        """GPU index -> (job id, run) of every claim on record."""
        rows = self._exec("SELECT gpu_index, job_id, run FROM gpu_claims")
        return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}


def _path_value(path: str) -> str | bytes:
    """A path as SQLite can hold it: text, or its raw bytes where it is not UTF-8 (a directory name from
    another locale reaches Python as lone surrogates, which SQLite's text refuses)."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def _ranks_row(ranks: Ranks | None) -> tuple[int | None, int | None, int | None]:
    return (ranks.rank, ranks.local_rank, ranks.group_rank) if ranks else (None, None, None)


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


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _finding_body(finding: Finding, at: float) -> str:
    """The stored JSON of a finding recorded at `at`: the same text for its insert and its resolution."""
    return json.dumps(finding._replace(at=at, resolved_at=None).to_json())

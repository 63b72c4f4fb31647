"""The store's reads of many jobs at once (`ps`, the web's job list, /metrics): one query per question
whatever the number of jobs, by index, and nothing decoded that a list does not show.

Functions over the store's `Database` (store/db.py), which `Store` delegates to; kept apart from the
reads of one job (store/jobs.py) because these answer for lists, where the cost of a long history (10,000
ended runs) shows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from jobwarden.model import UNFINISHED_STATES, JobState
from jobwarden.store.db import Database
from jobwarden.store.records import JobSummary, RunRecord, decode_json, run_from_values
from jobwarden.store.rollup import TIERS

_UNFINISHED = tuple(sorted(UNFINISHED_STATES))
_RUN_COLUMNS = ", ".join(f"r.{name}" for name in RunRecord._fields)
_JOB_AT = len(RunRecord._fields)  # the job's columns follow the run's
# more job ids than this (SQLite before 3.32 allows 999 parameters in a statement): read a range instead
_CHUNK = 500


def job_list(
    db: Database,
    *,
    unfinished_only: bool = False,
    ended_since: float | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[tuple[JobSummary, RunRecord]]:
    """Each job with its latest run, in job id order. `unfinished_only`: jobs whose latest run is
    not over (active or lost); `ended_since`: those, and the ones ended at or after that moment.
    `limit` and `offset` count from the newest job: limit=50 is the 50 newest, offset=50 the 50
    before them."""
    unfinished = f"state IN ({', '.join('?' * len(_UNFINISHED))})"
    conditions = ["r.n = (SELECT MAX(m.n) FROM runs m WHERE m.job_id = r.job_id)"]
    params: list[Any] = []
    if ended_since is not None:  # a union: SQLite reads an OR of two columns by a scan of every run
        conditions.append(
            f"r.rowid IN (SELECT rowid FROM runs WHERE {unfinished} "
            "UNION ALL SELECT rowid FROM runs WHERE ended_at >= ?)"
        )
        params += [*_UNFINISHED, ended_since]
    elif unfinished_only:
        conditions.append(f"r.{unfinished}")
        params += _UNFINISHED
    sql = (
        f"SELECT {_RUN_COLUMNS}, j.name, j.command, j.created_at "
        f"FROM runs r JOIN jobs j ON j.id = r.job_id WHERE {' AND '.join(conditions)} "
        "ORDER BY r.job_id DESC"
    )
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        params += [-1 if limit is None else limit, offset]
    rows = db.exec(sql, params).fetchall()
    return [_job_and_run(row) for row in reversed(rows)]


def current_findings(
    db: Database, runs: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], list[tuple[str, str]]]:
    """(job id, run) -> (rule, title) of each finding the shim recorded for that run that is still
    true (not resolved), oldest first; runs without one are left out. One query for the whole list."""
    wanted = set(runs)
    job_ids = sorted({job_id for job_id, _ in wanted})
    if not job_ids:
        return {}
    if len(job_ids) > _CHUNK:
        where, params = "job_id BETWEEN ? AND ?", [job_ids[0], job_ids[-1]]
    else:
        where, params = f"job_id IN ({', '.join('?' * len(job_ids))})", job_ids
    found: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for job_id, run, rule, body in db.exec(
        f"SELECT job_id, run, rule, body FROM findings WHERE {where} AND resolved_at IS NULL "
        "ORDER BY at, rowid",
        params,
    ):
        if (job_id, run) in wanted:
            title = decode_json(body).get("title") if body else None
            found.setdefault((job_id, run), []).append((rule, str(title or rule)))
    return found


def finding_counts(db: Database) -> dict[str, int]:
    """Rule -> how many findings of it the store holds, over every run."""
    rows = db.exec("SELECT rule, COUNT(*) FROM findings GROUP BY rule ORDER BY rule")
    return {rule: count for rule, count in rows}


def run_state_counts(db: Database, states: Iterable[JobState]) -> dict[JobState, int]:
    """State -> how many runs are in it, for the states asked (read off the state index)."""
    wanted = sorted(states)
    marks = ", ".join("?" * len(wanted))
    rows = db.exec(f"SELECT state, COUNT(*) FROM runs WHERE state IN ({marks}) GROUP BY state", wanted)
    return {JobState(state): count for state, count in rows}


def peak_rss(db: Database, job_id: int, run: int) -> int | None:
    """The most resident memory the run's processes held together, from its samples: the coarsest
    points (kept for ever), the finest points since, and the raw readings since those, each a short
    range of its table's key however long the run."""
    coarse, fine = max(TIERS), min(TIERS)
    rollup = "FROM samples_rollup WHERE job_id = ?1 AND run = ?2 AND tier = "
    row = db.exec(
        "SELECT MAX(v) FROM ("
        f"SELECT MAX(rss_max_mib) * 1048576 AS v {rollup}?3 "
        f"UNION ALL SELECT MAX(rss_max_mib) * 1048576 {rollup}?4 AND at >= "
        f"(SELECT COALESCE(MAX(at) + ?3, 0) {rollup}?3) "
        "UNION ALL SELECT MAX(rss_bytes) FROM samples WHERE job_id = ?1 AND run = ?2 AND at >= "
        f"(SELECT COALESCE(MAX(at) + ?4, 0) {rollup}?4))",
        (job_id, run, coarse, fine),
    ).fetchone()
    value = row[0]  # a text that a hand (not jobwarden) put into a number column is no peak
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _job_and_run(row: Sequence[Any]) -> tuple[JobSummary, RunRecord]:
    name, command, created_at = row[_JOB_AT:]
    return JobSummary(row[0], name, tuple(decode_json(command)), created_at), run_from_values(row)

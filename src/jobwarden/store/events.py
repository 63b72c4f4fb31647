"""What a run's record tells of it besides its state: its events (an append-only log), the findings its
shim concluded while it was live, and its stack dumps. Functions over the store's `Database`
(store/db.py); `Store` delegates."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobwarden.model import Finding
from jobwarden.store.db import Database
from jobwarden.store.records import Event, StackDump

if TYPE_CHECKING:  # diagnosis types: not on the `run` path
    from jobwarden.observations import ProcessStack


# --- events ---------------------------------------------------------------------------------------


def add_event(db: Database, job_id: int, run: int | None, kind: str, at: float, **data: Any) -> None:
    db.exec(
        "INSERT INTO events (job_id, run, at, kind, data) VALUES (?,?,?,?,?)",
        (job_id, run, at, kind, json.dumps(data)),
    )


def events(db: Database, job_id: int, run: int | None = None) -> list[Event]:
    sql, params = "SELECT * FROM events WHERE job_id = ?", [job_id]
    if run is not None:
        sql += " AND run = ?"
        params.append(run)
    return [
        Event(r["at"], r["run"], r["kind"], json.loads(r["data"]))
        for r in db.exec(sql + " ORDER BY id", params)
    ]


# --- findings -------------------------------------------------------------------------------------


def add_finding(db: Database, job_id: int, run: int, at: float, finding: Finding) -> None:
    """Record a finding the shim concluded while the run is live."""
    db.exec(
        "INSERT INTO findings (job_id, run, at, rule, body) VALUES (?,?,?,?,?)",
        (job_id, run, at, finding.rule, _finding_body(finding, at)),
    )


def resolve_finding(db: Database, job_id: int, run: int, finding: Finding, at: float) -> None:
    """`finding`, recorded at `finding.at`, stopped being true at `at` (the process resumed, progress
    came back). Named by its moment and body, not a row id: the shim's writer may have deferred the
    insert while another process held the lock. Once: a later call leaves the first moment."""
    if finding.at is None:
        raise ValueError("a finding is resolved by the moment it was recorded at")
    db.exec(
        "UPDATE findings SET resolved_at = ? WHERE job_id = ? AND run = ? AND at = ? AND body = ? "
        "AND resolved_at IS NULL",
        (at, job_id, run, finding.at, _finding_body(finding, finding.at)),
    )


def update_finding(db: Database, job_id: int, run: int, finding: Finding, latest: Finding) -> None:
    """`finding`, recorded at `finding.at` and still current, is now as `latest` says (a speed finding's
    figures move while it stays true: "3.0x" becomes "3.4x"). Named like resolve_finding, by its moment
    and body; it keeps its moment. A resolved finding keeps the text it had when it stopped being true."""
    if finding.at is None:
        raise ValueError("a finding is updated by the moment it was recorded at")
    db.exec(
        "UPDATE findings SET body = ? WHERE job_id = ? AND run = ? AND at = ? AND body = ? "
        "AND resolved_at IS NULL",
        (_finding_body(latest, finding.at), job_id, run, finding.at, _finding_body(finding, finding.at)),
    )


def findings(db: Database, job_id: int, run: int) -> list[tuple[float, Finding]]:
    """Findings the shim recorded while the run was live (hangs, lost workers), oldest first, each with
    when it was found and, once it stopped being true, when that was."""
    rows = db.exec(
        "SELECT at, resolved_at, body FROM findings WHERE job_id = ? AND run = ? ORDER BY at, rowid",
        (job_id, run),
    )
    return [
        (r["at"], Finding.from_json(json.loads(r["body"]))._replace(at=r["at"], resolved_at=r["resolved_at"]))
        for r in rows
    ]


def _finding_body(finding: Finding, at: float) -> str:
    """The stored JSON of a finding recorded at `at`: the same text for its insert and its resolution."""
    return json.dumps(finding._replace(at=at, resolved_at=None).to_json())


# --- stack dumps ----------------------------------------------------------------------------------


def add_stacks(
    db: Database, job_id: int, run: int, at: float, trigger: str, stacks: Sequence[ProcessStack]
) -> int:
    cur = db.exec(
        "INSERT INTO stacks (job_id, run, at, trigger, body) VALUES (?,?,?,?,?)",
        (job_id, run, at, trigger, json.dumps([s.to_json() for s in stacks])),
    )
    return int(cur.lastrowid or 0)


def stacks(db: Database, job_id: int, run: int) -> list[StackDump]:
    rows = db.exec("SELECT * FROM stacks WHERE job_id = ? AND run = ? ORDER BY at, id", (job_id, run))
    return [StackDump.from_row(r) for r in rows]

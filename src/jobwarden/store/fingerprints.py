"""Each run's fingerprint (observations.Fingerprint): written once by its shim, read by `jobwarden diff`,
`explain` and the web's job page. The package list is kept apart, once per distinct list (package_sets):
its hash names it, and the runs of one environment share the row.

Two runs are "of the same command" when their command and cwd are: `same_command` hashes both, and
`last_success` finds, by that index, the newest run of the command that succeeded before a moment."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobwarden.store.db import Database, translate, write

if TYPE_CHECKING:  # the store is on the path of `run`, which reads no fingerprint
    from jobwarden.observations import Fingerprint

_COMPACT = (",", ":")


def same_command(command: Sequence[str], cwd: str) -> str:
    """The key shared by every run of this command in this directory."""
    return _digest(json.dumps([list(command), cwd], separators=_COMPACT))[:32]


def packages_hash(packages: Sequence[tuple[str, str]]) -> str:
    """The hash of an environment's `name==version` list (sorted by name, as Fingerprint keeps it)."""
    return _digest("\n".join(f"{name}=={version}" for name, version in packages))[:32]


def _digest(text: str) -> str:
    return _sha256_hex(text.encode("utf-8", "surrogateescape"))


def _sha256_hex(data: bytes) -> str:
    """SHA-256 from CPython's own module where it has one: the supervisor hashes a fingerprint at every
    start, and `import hashlib` initialises every OpenSSL algorithm first, 3-6 ms of CPU charged to the
    job's quota."""
    module: Any
    try:
        import _sha256 as module  # type: ignore[import-not-found, no-redef]  # CPython up to 3.11
    except ImportError:
        try:
            import _sha2 as module  # type: ignore[import-not-found, no-redef]  # CPython 3.12+
        except ImportError:
            import hashlib as module
    return str(module.sha256(data).hexdigest())


def set_fingerprint(db: Database, job_id: int, run: int, at: float, fingerprint: Fingerprint) -> None:
    packages = fingerprint.packages
    digest = packages_hash(packages) if packages is not None else None
    body = json.dumps(fingerprint.to_json(packages=False), separators=_COMPACT)
    try:
        with write(db.conn):
            if packages is not None:
                db.conn.execute(
                    "INSERT OR IGNORE INTO package_sets (hash, list) VALUES (?, ?)",
                    (digest, json.dumps([list(p) for p in packages], separators=_COMPACT)),
                )
            db.conn.execute(
                "INSERT OR REPLACE INTO fingerprints (job_id, run, at, same, body, packages) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, run, at, same_command(fingerprint.command, fingerprint.cwd), body, digest),
            )
    except sqlite3.Error as err:
        raise translate(err, db.layout.database) from err


def fingerprint(db: Database, job_id: int, run: int) -> Fingerprint | None:
    """The run's fingerprint, its packages included; None when it has none (a run started before
    fingerprints were taken, or one that never started)."""
    row = db.exec(
        "SELECT f.body, p.list FROM fingerprints f LEFT JOIN package_sets p ON p.hash = f.packages "
        "WHERE f.job_id = ? AND f.run = ?",
        (job_id, run),
    ).fetchone()
    if row is None:
        return None
    from jobwarden.observations import Fingerprint

    packages = tuple((str(n), str(v)) for n, v in json.loads(row[1])) if row[1] is not None else None
    return Fingerprint.from_json(json.loads(row[0]), packages)


def last_success(
    db: Database, command: Sequence[str], cwd: str, before: float, besides: tuple[int, int]
) -> tuple[int, int] | None:
    """(job id, run) of the newest run with a fingerprint of this command in this cwd that succeeded
    and started before `before`, `besides` excepted; None when there is none."""
    row = db.exec(
        "SELECT f.job_id, f.run FROM fingerprints f "
        "JOIN runs r ON r.job_id = f.job_id AND r.n = f.run "
        "WHERE f.same = ? AND r.state = 'succeeded' AND r.started_at < ? "
        "AND NOT (f.job_id = ? AND f.run = ?) ORDER BY r.started_at DESC LIMIT 1",
        (same_command(command, cwd), before, *besides),
    ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def forget_unused_package_sets(conn: sqlite3.Connection) -> None:
    """Package lists no fingerprint names any more (their jobs were removed); in the caller's write."""
    conn.execute(
        "DELETE FROM package_sets WHERE hash NOT IN "
        "(SELECT packages FROM fingerprints WHERE packages IS NOT NULL)"
    )

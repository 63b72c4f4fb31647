"""Persistence: SQLite (WAL, busy timeout, versioned schema) plus per-run files."""

from jobwarden.store.records import JobRecord, RunRecord
from jobwarden.store.repo import Store

__all__ = ["JobRecord", "RunRecord", "Store"]

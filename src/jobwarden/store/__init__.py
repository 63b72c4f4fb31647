"""Persistence: SQLite (WAL, busy timeout, versioned schema) plus per-run files."""

from jobwarden.store.records import JobRecord, JobSummary, RunRecord
from jobwarden.store.repo import Store

__all__ = ["JobRecord", "JobSummary", "RunRecord", "Store"]

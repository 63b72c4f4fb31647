"""What the container tests share: the job scripts copied into a test's /t, the store read on the host."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jobwarden.model import Finding
from jobwarden.store import RunRecord, Store
from jobwarden.store.records import Event
from jobwarden.verdict.explainer import findings_for

JOBS = Path(__file__).parent / "jobs"
COMMON_JOBS = Path(__file__).parents[1] / "jobs"


def add_job(tmp: Path, name: str) -> str:
    """Copy a job script into the test's directory; its path inside the container."""
    source = JOBS / name if (JOBS / name).exists() else COMMON_JOBS / name
    shutil.copy(source, tmp / name)
    return f"/t/{name}"


def events(home: Path, job_id: int = 1, run: int = 1) -> list[Event]:
    """The run's events, read from the store alone (never `refresh`: the pids are the container's)."""
    if not (home / "jobwarden.db").exists():
        return []
    with Store(home) as store:
        return store.events(job_id, run)


def ended(home: Path, job_id: int = 1) -> tuple[RunRecord, list[Finding], list[str]]:
    """The last run of an ended job, its findings (root cause first) and the triggers of its stacks."""
    with Store(home) as store:
        job = store.job(job_id)
        run = store.run(job_id)
        assert run.state.is_ended, run
        return run, findings_for(store, job, run), [s.trigger for s in store.stacks(job_id, run.n)]


def rules(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def data(events_: list[Event], kind: str) -> list[dict[str, Any]]:
    return [e.data for e in events_ if e.kind == kind]

"""What changed between two runs (`jobwarden diff`, the job's page, `explain`): their fingerprints, taken
by the shim at each launch (shim.record.fingerprint), compared by rules.changes.

`diff A` compares A's run with the last run of the same command (the same argv in the same cwd) that
succeeded before it started: "it worked yesterday, what is different?". `diff A B` compares the two. The
changes read from the earlier run to the later one, whichever was named first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from jobwarden.clock import iso, shown_time
from jobwarden.errors import JobwardenError
from jobwarden.model import JobState
from jobwarden.observations import Fingerprint
from jobwarden.rules.changes import Change, compare, summary
from jobwarden.store import JobRecord, RunRecord, Store

if TYPE_CHECKING:
    from pathlib import Path

    from jobwarden.control.views.jobstatus import JobStatus
    from jobwarden.osapi.procfs import ProcFS

SHOWN_IN_EXPLAIN = 6  # changes named on explain's line; `jobwarden diff` lists them all


class NothingToCompare(JobwardenError):
    """A run without a fingerprint, or with no earlier success to compare it with."""


class Side(NamedTuple):
    job: JobRecord
    run: RunRecord
    fingerprint: Fingerprint

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.job.id,
            "run": self.run.n,
            "name": self.job.name,
            "state": str(self.run.state),
            "started_at": iso(self.run.started_at),
        }

    def said(self) -> str:
        """'run 3 of job 12 (succeeded, 2026-11-27 10:00:00 +01:00)'."""
        started = shown_time(self.run.started_at) if self.run.started_at is not None else "never started"
        return f"run {self.run.n} of job {self.job.id} ({self.run.state}, {started})"


class RunDiff(NamedTuple):
    """A's run and B's (the last success before A, when only A was named); `before` is the earlier."""

    a: Side
    b: Side
    changes: list[Change]
    baseline: bool  # b was found as A's command's last success

    @property
    def before(self) -> Side:
        return self.b if _start(self.b) <= _start(self.a) else self.a

    @property
    def after(self) -> Side:
        return self.a if self.before is self.b else self.b

    def to_json(self) -> dict[str, Any]:
        """`diff --json`: {a: {id, run}, b: {id, run}, changes: [{what, before, after}]} (DESIGN.md)."""
        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "changes": [c.to_json() for c in self.changes],
            "before": "b" if self.before is self.b else "a",
        }


def _start(side: Side) -> float:
    return side.run.started_at or 0.0


def diff_runs(home: Path, a_ref: str, b_ref: str | None = None, run_n: int | None = None) -> RunDiff:
    """Run `run_n` (default: the last) of job A against job B's last run, or, without B, against the last
    success of A's command before it. Raises JobNotFound, NothingToCompare."""
    with Store(home) as store:
        return _diff(store, a_ref, b_ref, run_n)


def _diff(store: Store, a_ref: str, b_ref: str | None, run_n: int | None) -> RunDiff:
    a = _side(store, store.job(a_ref), run_n)
    if b_ref is not None:
        b = _side(store, store.job(b_ref), None)
        baseline = False
    else:
        b = _last_success(store, a)
        baseline = True
    diff = RunDiff(a, b, [], baseline)
    return diff._replace(changes=compare(diff.before.fingerprint, diff.after.fingerprint))


def _side(store: Store, job: JobRecord, run_n: int | None) -> Side:
    run = store.run(job.id, run_n)
    fingerprint = store.fingerprint(job.id, run.n)
    if fingerprint is None:
        raise NothingToCompare(f"run {run.n} of job {job.id} has no fingerprint: {_why_none(run)}", _REMEDY)
    return Side(job, run, fingerprint)


_REMEDY = "jobwarden rerun JOB starts it again with one; diff compares runs that have one"


def _why_none(run: RunRecord) -> str:
    if run.state in (JobState.QUEUED, JobState.RESTARTING) or (
        run.state == JobState.STARTING and run.pid is None
    ):
        return "it has not started yet"
    if run.state in (JobState.STARTING, JobState.RUNNING):
        return "it is being taken (within seconds of the start)"
    if run.pid is None:
        return "it never started"
    return "it was started by a jobwarden older than fingerprints, or its supervisor died first"


def _last_success(store: Store, a: Side) -> Side:
    found = store.last_success(
        a.job.command, a.job.cwd, a.run.started_at or float("inf"), besides=(a.job.id, a.run.n)
    )
    if found is None:
        raise NothingToCompare(
            f"no run of job {a.job.id}'s command succeeded before run {a.run.n} "
            "(the same command in the same directory, with a fingerprint)",
            f"compare it with another job: jobwarden diff {a.job.id} OTHER",
        )
    job = a.job if found[0] == a.job.id else store.job(found[0])
    return _side(store, job, found[1])


def explained(home: Path, procfs: ProcFS, job_ref: str | int, run_n: int | None = None) -> JobStatus:
    """The job's view as `explain` shows it (the CLI, the web's explain, `top`'s explain key): a
    failure's root cause citing what changed since its command last succeeded."""
    from jobwarden.control.views.jobstatus import job_status

    with Store(home) as store:
        return cite_changes(store, job_status(store, procfs, job_ref, run_n))


def cite_changes(store: Store, status: JobStatus) -> JobStatus:
    """`explain` of a failure that follows a success of the same command: its root cause names, as
    evidence, what changed since that success ("since run 3 of job 12 succeeded: torch 2.12.0 ->
    2.13.0; git commit 1a2b3c4 -> 9f8e7d6 (dirty)"), or that nothing recorded did."""
    current = status.current_findings
    if status.run.state != JobState.FAILED or not current:
        return status
    try:
        diff = _diff(store, str(status.job.id), None, status.run.n)
    except NothingToCompare:
        return status
    cause = current[0]
    cited = cause._replace(evidence=(*cause.evidence, changes_line(diff)))
    return status._replace(findings=[cited if f is cause else f for f in status.findings])


def changes_line(diff: RunDiff) -> str:
    """One line: what changed since the success `diff.b` (a baseline diff), at most SHOWN_IN_EXPLAIN."""
    since = f"since run {diff.b.run.n} of job {diff.b.job.id} succeeded"
    if not diff.changes:
        return f"nothing recorded changed {since}: the same command, code, packages, host and GPUs"
    more = len(diff.changes) - SHOWN_IN_EXPLAIN
    tail = f" (jobwarden diff {diff.a.job.id} lists all)" if more > 0 else ""
    return f"{since}: {summary(diff.changes, SHOWN_IN_EXPLAIN)}{tail}"

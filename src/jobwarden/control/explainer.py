"""Gather a run's evidence from the store and files, and hand it to the pure rules."""

from __future__ import annotations

from jobwarden.model import Finding
from jobwarden.rules import RunEvidence, explain
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.logfiles import tail_lines

_TAIL_LINES = 60


def findings_for(store: Store, job: JobRecord, run: RunRecord) -> list[Finding]:
    tail = [
        b.decode("utf-8", "replace").rstrip("\n")
        for b in tail_lines(store.layout.output_log(job.id, run.n), _TAIL_LINES)
    ]
    events = tuple(e.kind for e in store.events(job.id, run.n))
    evidence = RunEvidence(
        state=str(run.state),
        exit_code=run.exit_code,
        signal=run.signal,
        end_reason=run.end_reason,
        pid=run.pid,
        error=run.error,
        timeout_s=job.options.get("timeout_s"),
        orphans_left=run.orphans_left,
        survivors=[s.__dict__ for s in run.survivors],
        log_tail=tail,
        events=events,
    )
    return explain(evidence)

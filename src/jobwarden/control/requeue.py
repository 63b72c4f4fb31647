"""The requeue contract (docs/cluster.md, "Requeue"): a run started with --requeue-exit CODE exits with
CODE only when its root cause is retryable (killed from outside with no OOM, its supervisor lost, a peer's
node lost), never for an exception or an OOM, never for a rank that was collateral damage, and only while
the engine's attempt (SLURM_RESTART_COUNT) is below --max-requeues. Slurm's RequeueExit then requeues it.
"""

from __future__ import annotations

from pathlib import Path

from jobwarden.errors import JobwardenError
from jobwarden.model import JobState
from jobwarden.store import RunRecord, Store

_NEVER = ("oom-kill", "cuda-oom", "python-exception")


def requeue_code(home: Path, run: RunRecord) -> int | None:
    """CODE for a run that asked for one and whose end is retryable; None otherwise (the job's own
    status stands). Loads the rules only for a run with --requeue-exit."""
    if run.state not in (JobState.FAILED, JobState.LOST):
        return None
    with Store(home) as store:
        job = store.job(str(run.job_id))
        options = job.options
        if options.requeue_exit is None:
            return None
        if options.max_requeues is not None and options.attempt >= options.max_requeues:
            return None
        from jobwarden.rules.group import RETRYABLE_RULES
        from jobwarden.verdict.explainer import findings_for

        rules = [f.rule for f in findings_for(store, job, run)]
    if not rules or rules[0] not in RETRYABLE_RULES or any(r in _NEVER for r in rules):
        return None
    if options.group and not _group_agrees(
        home, options.group, options.group_dir, options.attempt, options.rank
    ):
        return None
    return options.requeue_exit


def _group_agrees(home: Path, group: str, group_dir: str | None, attempt: int, rank: int | None) -> bool:
    """With the group's records at hand: only when the group's root cause is retryable too, and this rank
    is not collateral damage of another rank's failure. No records (not shared, not written): this run's
    own verdict stands."""
    from jobwarden.control.views.group import group_view

    try:
        view = group_view(home, group, attempt, group_dir)
    except JobwardenError:
        return True
    mine = next((r for r in view.verdict.ranks if rank is not None and r.story.rank == rank), None)
    return view.verdict.retryable and (mine is None or mine.role != "collateral")

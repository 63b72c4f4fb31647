"""The job list over a real store: which jobs `ps` and the web's list show, paging from the newest, the
top finding of each, and that the reads go by index and stay one query however long the history."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.control.views.joblist import job_views
from jobwarden.model import Finding, JobSpec, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store
from jobwarden.store.listing import _CHUNK

NOW = 1_700_000_000.0


# `ps --json`: the contract (DESIGN.md) and what the web list serves
SUMMARY_KEYS = [
    "id",
    "name",
    "state",
    "run",
    "pid",
    "finding",
    "finding_title",
    "exit_code",
    "signal",
    "started_at",
    "ended_at",
    "cpu_percent",
    "rss_bytes",
    "command",
    "progress",
    "hung",
    "gpu_ids",
]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as s:
        yield s


def add_job(store: Store, name: str, *states: JobState, ended_at: float | None = None) -> int:
    """A job with one run per state, the last its latest; ended runs end at `ended_at`."""
    spec = JobSpec(command=("python", f"{name}.py"), cwd="/w", name=name, env={"TOKEN": "secret"})
    job_id, _ = store.create_job(spec, {"on_hang": "dump"}, NOW)
    for n, state in enumerate(states, start=1):
        if n > 1:
            store.new_run(job_id, state, NOW)
        store.update_run(job_id, n, state=state, ended_at=ended_at if state.is_ended else None)
    return job_id


def finding(rule: str) -> Finding:
    return Finding(rule, rule, "what happened", "error")


def test_unfinished_only_lists_the_jobs_whose_latest_run_is_not_over(store: Store) -> None:
    done = add_job(store, "done", JobState.SUCCEEDED)
    restarted = add_job(store, "restarted", JobState.FAILED, JobState.RUNNING)
    lost = add_job(store, "lost", JobState.LOST)
    over = add_job(store, "over", JobState.RUNNING, JobState.FAILED)  # an old run left unfinished
    listed = store.job_list(unfinished_only=True)
    assert [(job.id, run.n, run.state) for job, run in listed] == [
        (restarted, 2, JobState.RUNNING),
        (lost, 1, JobState.LOST),
    ]
    everything = store.job_list()
    assert [(job.id, run.n) for job, run in everything] == [(done, 1), (restarted, 2), (lost, 1), (over, 2)]


def test_the_list_reads_what_it_shows_and_nothing_of_the_environment(store: Store) -> None:
    job_id = add_job(store, "train", JobState.FAILED)
    store.update_run(job_id, 1, exit_code=3, gpu_ids=[0, 2], survivors=[])
    [(job, run)] = store.job_list()
    assert (job.id, job.name, job.command, job.created_at) == (job_id, "train", ("python", "train.py"), NOW)
    assert not hasattr(job, "env") and not hasattr(job, "options")
    assert run == store.run(job_id)  # the same record as the one-job read, field for field


def test_limit_and_offset_page_from_the_newest_job_in_id_order(store: Store) -> None:
    ids = [add_job(store, f"j{i}", JobState.SUCCEEDED) for i in range(7)]
    assert [job.id for job, _ in store.job_list(limit=3)] == ids[4:]
    assert [job.id for job, _ in store.job_list(limit=3, offset=3)] == ids[1:4]
    assert [job.id for job, _ in store.job_list(offset=5)] == ids[:2]
    assert store.job_list(limit=3, offset=10) == []


def test_ended_since_adds_the_recently_ended_to_the_unfinished(store: Store) -> None:
    add_job(store, "old", JobState.FAILED, ended_at=NOW - 90_000)
    recent = add_job(store, "recent", JobState.FAILED, ended_at=NOW - 60)
    live = add_job(store, "live", JobState.RUNNING)
    listed = store.job_list(ended_since=NOW - 86_400)
    assert [job.id for job, _ in listed] == [recent, live]


def test_unfinished_and_recent_runs_are_found_by_index(store: Store) -> None:
    """No scan of every run: a history of 100,000 runs must not slow `ps` or /metrics down. The plans
    are those of the statements job_list really ran (traced with their values)."""
    assert "USING INDEX runs_by_state" in _plan(store, unfinished_only=True)
    recent = _plan(store, ended_since=NOW)
    assert "runs_by_state" in recent and "runs_by_end" in recent, recent


def _plan(store: Store, **kwargs: object) -> str:
    traced: list[str] = []
    store._db.conn.set_trace_callback(traced.append)
    try:
        store.job_list(**kwargs)  # type: ignore[arg-type]
    finally:
        store._db.conn.set_trace_callback(None)
    [sql] = [s for s in traced if s.startswith("SELECT")]
    return " | ".join(row["detail"] for row in store._db.conn.execute(f"EXPLAIN QUERY PLAN {sql}"))


def test_current_findings_of_many_runs_in_one_read(store: Store) -> None:
    ids = [add_job(store, f"j{i}", JobState.FAILED, JobState.FAILED) for i in range(_CHUNK + 5)]
    store.add_finding(ids[0], 2, NOW + 2, finding("exit-code"))
    store.add_finding(ids[0], 2, NOW + 1, finding("no-progress"))
    store.add_finding(ids[0], 2, NOW + 1.5, finding("process-stopped"))
    store.resolve_finding(ids[0], 2, finding("process-stopped")._replace(at=NOW + 1.5), NOW + 3)  # history
    store.add_finding(ids[0], 1, NOW, finding("oom-kill"))  # an earlier attempt: not asked for
    store.add_finding(ids[-1], 2, NOW, finding("timeout"))
    for asked in (ids, ids[:1] + ids[-1:]):  # a range read, and a lookup of a few
        found = store.current_findings((job_id, 2) for job_id in asked)
        rules = {run: [rule for rule, _ in pairs] for run, pairs in found.items()}
        assert rules == {(ids[0], 2): ["no-progress", "exit-code"], (ids[-1], 2): ["timeout"]}
    assert store.current_findings([]) == {}


def test_job_views_show_each_runs_root_cause_first(store: Store) -> None:
    hung = add_job(store, "hung", JobState.FAILED)
    store.add_finding(hung, 1, NOW, finding("exit-code"))
    store.add_finding(hung, 1, NOW + 1, finding("pool-worker-lost"))
    store.add_finding(hung, 1, NOW + 2, finding("no-progress"))
    clean = add_job(store, "clean", JobState.SUCCEEDED)
    lost = add_job(store, "lost", JobState.LOST)
    views = job_views(store, ProcFS(), include_ended=True)
    assert [(v.job.id, v.finding) for v in views] == [(hung, "pool-worker-lost"), (clean, None), (lost, None)]
    assert [v.job.id for v in job_views(store, ProcFS(), include_ended=False)] == [lost]
    assert [v.job.id for v in job_views(store, ProcFS(), include_ended=True, limit=2)] == [clean, lost]
    assert [v.job.id for v in job_views(store, ProcFS(), include_ended=True, limit=1, offset=2)] == [hung]
    summary = views[0].summary_json()
    assert list(summary) == SUMMARY_KEYS
    assert summary["finding"] == "pool-worker-lost" and summary["command"] == ["python", "hung.py"]

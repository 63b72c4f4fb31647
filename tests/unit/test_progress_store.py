"""Progress in the store: each run's latest (kept after the end, read for a whole list in one query), and
the series beside the samples, through the tiers (migration 9). Old databases keep opening."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.control.views.metrics import job_samples
from jobwarden.model import JobSpec, JobState
from jobwarden.progress.model import Progress
from jobwarden.store import Store
from jobwarden.store.rollup import Reading, Rollup

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
T0 = 1_700_000_400.0  # a multiple of 600: tier points begin with it


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as s:
        yield s


def new_job(store: Store, name: str = "train") -> int:
    job_id, _ = store.create_job(JobSpec(("python", "t.py"), "/tmp", name, {}), {}, T0, JobState.RUNNING)
    return job_id


def progress(step: int | None, **changes: object) -> Progress:
    fields: dict[str, object] = {
        "step": step,
        "total": 1000,
        "rate": 5.4,
        "unit": "it",
        "epoch": 3.0,
        "metrics": (("loss", 0.0116),),
        "source": "output",
        "format": "tqdm",
        "at": T0 + 10,
        "label": "Epoch 3",
        "observed": "in-process",
        "rank": 0,
        "first_step": step,
        **changes,
    }
    return Progress(**fields)  # type: ignore[arg-type]


def test_the_latest_progress_reads_back_whole(store: Store) -> None:
    job = new_job(store)
    assert store.progress(job, 1) is None
    store.set_progress(job, 1, progress(450))
    assert store.progress(job, 1) == progress(450)


def test_the_first_step_of_a_run_stays_where_it_began(store: Store) -> None:
    """A shim that adopts the run sees it for the first time at a later step: where the run resumed from
    is the first writer's."""
    job = new_job(store)
    store.set_progress(job, 1, progress(600))
    store.set_progress(job, 1, progress(620, first_step=615, closed=True, stalled_since=T0 + 5))
    got = store.progress(job, 1)
    assert got is not None and (got.step, got.first_step, got.closed, got.stalled_since) == (
        620,
        600,
        True,
        T0 + 5,
    )


def test_a_list_reads_every_run_in_one_query_its_metrics_when_asked(store: Store) -> None:
    jobs = [new_job(store, f"j{i}") for i in range(3)]
    store.set_progress(jobs[0], 1, progress(1))
    store.set_progress(jobs[2], 1, progress(3))
    found = store.progress_of_runs([(j, 1) for j in jobs] + [(jobs[0], 2)])
    assert set(found) == {(jobs[0], 1), (jobs[2], 1)}
    assert found[(jobs[2], 1)].step == 3 and found[(jobs[2], 1)].metrics == ()
    with_metrics = store.progress_of_runs([(jobs[2], 1)], metrics=True)
    assert with_metrics[(jobs[2], 1)] == progress(3)
    many = store.progress_of_runs([(j, 1) for j in range(1, 600)])  # a range, not 600 parameters
    assert set(many) == {(jobs[0], 1), (jobs[2], 1)}


def test_removing_a_job_removes_its_progress(store: Store) -> None:
    job = new_job(store)
    store.set_progress(job, 1, progress(5))
    store.delete_job(job)
    assert store.progress(job, 1) is None


def test_the_series_goes_through_the_tiers(store: Store) -> None:
    job = new_job(store)
    rollup = Rollup()
    readings = [
        Reading(
            T0 + s,
            1,
            100.0,
            1 << 20,
            step=s * 5,
            step_rate=5.0 if s else None,
            metrics=(("loss", 1.0 / (s + 1)),),
        )
        for s in range(130)
    ]
    closed = [b for r in readings for b in rollup.add(r)]
    store.add_samples(job, 1, readings, closed)
    raw = job_samples(store, job, 1)
    assert (raw[-1].step, raw[-1].step_rate) == (645, 5.0)
    assert raw[-1].to_json()["metrics"] == {"loss": pytest.approx(1 / 130)}
    # the 60 s tier: the last step of each point, the mean rate and loss
    coarse = store.rollups(job, 1, 60)
    assert [b.step for b in coarse] == [295, 595]
    assert coarse[0].step_rate.mean == pytest.approx(5.0)
    first = sum(1.0 / (s + 1) for s in range(60)) / 60
    assert coarse[0].metrics["loss"].mean == pytest.approx(first, rel=1e-4)


def test_a_sample_without_progress_says_null(store: Store) -> None:
    job = new_job(store)
    store.add_samples(job, 1, [Reading(T0, 1, 1.0, 1)], [])
    sample = job_samples(store, job, 1)[0].to_json()
    assert (sample["step"], sample["step_rate"], sample["metrics"]) == (None, None, {})


@pytest.mark.parametrize("version", [1, 4])
def test_an_old_database_opens_with_no_progress_and_takes_some(tmp_path: Path, version: int) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shutil.copyfile(FIXTURES / f"jobwarden-v{version}.db", home / "jobwarden.db")
    with Store(home) as s:
        job = s.jobs()[0]
        run = s.run(job.id)
        assert s.progress(job.id, run.n) is None
        assert all(x.step is None for x in job_samples(s, job.id, run.n))
        s.set_progress(job.id, run.n, progress(7))
        assert s.progress_of_runs([(job.id, run.n)])[(job.id, run.n)].step == 7
    conn = sqlite3.connect(home / "jobwarden.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM progress").fetchone()[0] == 1
    finally:
        conn.close()


def test_the_largest_counters_fit(store: Store) -> None:
    from jobwarden.progress.model import MAX_COUNT

    job = new_job(store)
    store.set_progress(job, 1, progress(MAX_COUNT, total=MAX_COUNT))
    assert store.progress(job, 1).step == MAX_COUNT  # type: ignore[union-attr]

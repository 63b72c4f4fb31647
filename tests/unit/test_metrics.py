"""The read API of a run's metric history (control.views.metrics) over a real SQLite store: samples and tiers
written as the shim writes them on a fake clock, read back stitched and thinned; sparklines; and a
schema-4 database read after migration 5."""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from pathlib import Path

import pytest

from jobwarden.clock import FakeClock, iso
from jobwarden.control.views.metrics import GpuSample, Sample, job_samples, per_second, sparkline
from jobwarden.model import JobSpec, JobState
from jobwarden.store import Store
from jobwarden.store.rollup import PRUNE_EVERY_S, GpuReading, Reading, Rollup
from jobwarden.store.schema import LATEST

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
T0 = 1_700_000_400.0
MIB = 1 << 20
JSON_KEYS = {"at", "cpu_percent", "rss_bytes", "nprocs", "io_read_bytes", "io_write_bytes", "gpu_util"}


def new_job(store: Store, started_at: float = T0) -> tuple[int, int]:
    spec = JobSpec(command=("python", "train.py"), cwd="/tmp", name="train.py", env={})
    job_id, run = store.create_job(spec, {}, started_at)
    store.update_run(job_id, run, state=JobState.RUNNING, started_at=started_at)
    return job_id, run


def reading(at: float, rss: int = 100 * MIB) -> Reading:
    elapsed = at - T0
    return Reading(
        at=at,
        nprocs=3,
        cpu_percent=150.0,
        rss_bytes=rss,
        cpu_time_s=round(elapsed * 1.5, 2),
        io_read_bytes=int(elapsed) * 1000,
        io_write_bytes=int(elapsed) * 4000,
        gpu_util=70.0,
        gpu_memory_bytes=6 * MIB,
        gpus=(GpuReading(0, 60.0, 2 * MIB), GpuReading(1, 80.0, 4 * MIB)),
    )


def run_shim(
    store: Store, job_id: int, run: int, clock: FakeClock, seconds: int, every_s: float = 1.0
) -> None:
    """What the shim's sampler does, on a fake clock: a reading each tick to the tiers, the raw rows
    and closed points written in batches, expired rows dropped once a minute, everything closed at the
    end. `spike_at`: one second of 10x memory."""
    rollup, batch, closed = Rollup(), [], []
    next_prune = clock.wall()
    for _ in range(int(seconds / every_s)):
        now = clock.wall()
        r = reading(now, rss=1000 * MIB if abs(now - (T0 + 7200)) < 0.5 else 100 * MIB)
        closed += rollup.add(r)
        batch.append(r)
        if now >= next_prune:
            store.add_samples(job_id, run, batch, closed, prune_at=now)
            batch, closed = [], []
            next_prune = now + PRUNE_EVERY_S
        clock.advance(every_s)
    store.add_samples(job_id, run, batch, closed + rollup.flush(), prune_at=clock.wall())


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "home") as s:
        yield s  # type: ignore[misc]


def test_a_reading_round_trips_through_record_tree(store: Store) -> None:
    job_id, run = new_job(store)
    store.record_tree(job_id, run, T0 + 5, [], [], reading(T0 + 5))
    (sample,) = job_samples(store, job_id, run, now=T0 + 6)
    assert sample == Sample(
        at=T0 + 5,
        cpu_percent=150.0,
        rss_bytes=100 * MIB,
        nprocs=3,
        io_read_bytes=5000,
        io_write_bytes=20000,
        gpu_util=70.0,
        gpu_memory_bytes=6 * MIB,
        cpu_time_s=7.5,
        gpus=(GpuSample(0, 60.0, 2 * MIB), GpuSample(1, 80.0, 4 * MIB)),
    )
    shown = sample.to_json()
    assert JSON_KEYS | {"gpu_memory_bytes", "t"} <= set(shown)
    assert (shown["at"], shown["t"]) == (iso(T0 + 5), T0 + 5)
    assert shown["gpus"] == [
        {"index": 0, "util": 60.0, "memory_bytes": 2 * MIB},
        {"index": 1, "util": 80.0, "memory_bytes": 4 * MIB},
    ]


def test_a_day_of_samples_reads_back_whole_at_the_resolution_asked(store: Store) -> None:
    job_id, run = new_job(store)
    clock = FakeClock(wall_start=T0)
    run_shim(store, job_id, run, clock, 26 * 3600, every_s=5.0)
    end = clock.wall()
    finest = job_samples(store, job_id, run, now=end)
    assert finest[0].at == T0 and finest[-1].at >= end - 10
    assert [s.at for s in finest] == sorted({s.at for s in finest})
    assert {s.step_s for s in finest} == {0.0, 10.0, 60.0}  # raw last hour, 10 s for 24 h, 1 min before
    assert max(s.rss_max_bytes or 0 for s in finest) == 1000 * MIB  # the spike at 2 h, held by a 1 min point
    chart = job_samples(store, job_id, run, points=200, now=end)
    assert 150 <= len(chart) <= 200
    assert chart[0].at == T0 and max(s.rss_max_bytes or 0 for s in chart) == 1000 * MIB
    # counters keep their last value (a point's CPU seconds whole)
    assert chart[-1].cpu_time_s == pytest.approx(finest[-1].cpu_time_s, abs=0.5)
    assert chart[-1].io_write_bytes == finest[-1].io_write_bytes
    last_hour = job_samples(store, job_id, run, since=end - 3600, points=100, now=end)
    assert last_hour[0].at >= end - 3600 - 10 and len(last_hour) <= 100


def test_expired_rows_are_dropped_and_the_history_stays_whole(store: Store, tmp_path: Path) -> None:
    job_id, run = new_job(store)
    clock = FakeClock(wall_start=T0)
    run_shim(store, job_id, run, clock, 9 * 86400, every_s=60.0)  # 9 days, a reading a minute
    conn = sqlite3.connect(tmp_path / "home" / "jobwarden.db")
    try:
        raw = conn.execute("SELECT MIN(at) FROM samples").fetchone()[0]
        tiers = dict(conn.execute("SELECT tier, MIN(at) FROM samples_rollup GROUP BY tier").fetchall())
    finally:
        conn.close()
    end = clock.wall()
    assert raw >= end - 3600 - 60
    assert tiers[10] >= end - 86400 - 10 and tiers[60] >= end - 7 * 86400 - 60
    assert tiers[600] == T0  # the 10 min tier lives as long as the job
    history = job_samples(store, job_id, run, points=500, now=end)
    assert history[0].at == T0 and len(history) <= 500
    step = 9 * 86400 / 500
    assert history[-1].at >= end - step and all(
        b.at - a.at <= 2 * step for a, b in itertools.pairwise(history)
    )
    assert history[-1].cpu_time_s == round((end - 60 - T0) * 1.5)  # the last reading's, whole seconds


def test_a_deleted_job_takes_its_points_along(store: Store) -> None:
    job_id, run = new_job(store)
    clock = FakeClock(wall_start=T0)
    run_shim(store, job_id, run, clock, 120)
    store.delete_job(job_id)
    assert store.rollups(job_id, run, 10) == [] and store.readings(job_id, run) == []


def test_per_second_derives_rates_from_counters() -> None:
    samples = [
        Sample(T0 + t, None, None, None, None, w, None, None, None)
        for t, w in [(0, 0), (2, 400), (3, None), (4, 100)]
    ]
    assert per_second(samples, "io_write_bytes") == [None, 200.0, None, None]  # unknown, then a reset


def test_sparkline_scales_from_zero_to_the_largest() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7], 8) == "▁▂▃▄▅▆▇█"
    assert sparkline([0.0, 0.0], 5) == "▁▁"
    assert sparkline([], 10) == "" and sparkline([1.0], 0) == ""


def test_sparkline_leaves_unknown_values_blank_and_honours_a_fixed_top() -> None:
    assert sparkline([None, 50.0, 100.0], 3, top=100.0) == " ▅█"
    assert sparkline([250.0], 1, top=100.0) == "█"


def test_sparkline_of_more_values_than_width_keeps_each_shares_largest() -> None:
    values: list[float | None] = [1.0] * 100
    values[37] = 10.0
    line = sparkline(values, 10)
    assert len(line) == 10 and line[3] == "█" and set(line) - {"█"} == {"▂"}


# --- a database written by schema 4 -----------------------------------------------------------------


@pytest.fixture
def v4_home(tmp_path: Path) -> Path:
    fixture = FIXTURES / "jobwarden-v4.db"
    conn = sqlite3.connect(f"file:{fixture}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4, "the fixture must stay a v4 database"
    finally:
        conn.close()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shutil.copyfile(fixture, home / "jobwarden.db")
    return home


def test_the_v4_fixture_is_one_self_contained_file() -> None:
    assert (FIXTURES / "jobwarden-v4.db").is_file() and not list(FIXTURES.glob("jobwarden-v4.db-*"))


def test_v4_samples_read_back_after_migration_with_unknown_new_fields(v4_home: Path) -> None:
    with Store(v4_home) as s:
        job = s.job("finetune.py")
        samples = job_samples(s, job.id, 1)
        assert [(x.nprocs, x.rss_bytes) for x in samples[:3]] == [
            (1, 31457280),
            (1, 209715200),
            (3, 524288000),
        ]
        assert len(samples) == 7 and samples[3].cpu_percent == 295.5
        assert all(x.io_write_bytes is None and x.gpu_util is None and x.gpus == () for x in samples)
        assert samples[-1].to_json()["io_read_bytes"] is None
        thinned = job_samples(s, job.id, 1, points=3)
        assert len(thinned) <= 3 and max(x.rss_max_bytes or 0 for x in thinned) == 734003200
        # the migrated store takes new samples and points next to the old ones
        s.add_samples(job.id, 1, [reading(1700000013.0)], Rollup().add(reading(1700000013.0)))
        assert len(job_samples(s, job.id, 1)) == 8
    conn = sqlite3.connect(v4_home / "jobwarden.db")
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST
        assert conn.execute("SELECT COUNT(*) FROM samples_rollup").fetchone()[0] == 0
    finally:
        conn.close()


def test_peak_rss_reads_the_largest_memory_of_every_tier_in_bytes(store: Store) -> None:
    job_id, run = new_job(store)
    clock = FakeClock(wall_start=T0)
    run_shim(store, job_id, run, clock, 3 * 3600, every_s=10.0)  # the spike at 2 h is in the 10 min tier
    assert store.peak_rss(job_id, run) == 1000 * MIB


@pytest.mark.parametrize("absurd", [1e300, -1e300, 1e18])
def test_a_sample_or_run_stored_at_an_absurd_time_is_skipped(store: Store, absurd: float) -> None:
    """One sample row with `at = 1e300` made `jobwarden metrics` exit 70 (OverflowError): from gmtime,
    then from SQLite, given a bucket's start computed from it. The sample (raw or a tier's point) is
    skipped; a run's start or end stored so bounds nothing."""
    from jobwarden.cli.metricsview import metrics_report

    job_id, run = new_job(store)
    good, bad = reading(T0 + 5), reading(T0 + 6)
    rollup = Rollup()
    rollup.add(bad)
    store.add_samples(job_id, run, [good, bad], rollup.flush(), prune_at=T0)
    conn = sqlite3.connect(store.layout.database)
    try:
        with conn:
            conn.execute("UPDATE samples SET at = ? WHERE at = ?", (absurd, T0 + 6))
            assert conn.execute("UPDATE samples_rollup SET at = ?", (absurd,)).rowcount > 0
            conn.execute("UPDATE runs SET started_at = ?, ended_at = ?", (absurd, absurd))
    finally:
        conn.close()
    for since in (None, T0):
        for points in (None, 100):
            shown = job_samples(store, job_id, run, since=since, points=points, now=T0 + 7)
            assert [s.at for s in shown] == [T0 + 5]
            assert shown[0].to_json()["at"] == iso(T0 + 5)
    assert list(metrics_report("train.py", job_id, run, shown, 80))

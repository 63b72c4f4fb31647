"""Downsampling as samples age (store.rollup), driven on a fake clock: tier boundaries, merge weights,
expiry, and how a history is stitched from the tiers and thinned to a number of points."""

from __future__ import annotations

import itertools

import pytest

from jobwarden.clock import FakeClock
from jobwarden.store.rollup import (
    RAW,
    RETENTION_S,
    TIERS,
    Bucket,
    Fetch,
    Gauge,
    GpuReading,
    Reading,
    Rollup,
    choose_tier,
    expiry,
    stitch,
    thin,
)

T0 = 1_700_000_400.0  # a multiple of 600: tier boundaries fall on round offsets
MIB = 1 << 20


def reading(at: float, cpu: float = 50.0, rss: int = 100 * MIB, **fields: object) -> Reading:
    values: dict[str, object] = {
        "nprocs": 2,
        "cpu_percent": cpu,
        "rss_bytes": rss,
        "cpu_time_s": at - T0,
        "io_read_bytes": int(at - T0) * 10,
        "io_write_bytes": int(at - T0) * 20,
        **fields,
    }
    return Reading(at, **values)  # type: ignore[arg-type]


def feed(rollup: Rollup, clock: FakeClock, seconds: int, **fields: object) -> list[Bucket]:
    """One reading a second for `seconds`, as the shim's ticks give them; the points that closed."""
    closed = []
    for _ in range(seconds):
        closed += rollup.add(reading(clock.wall(), **fields))  # type: ignore[arg-type]
        clock.advance(1.0)
    return closed


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(wall_start=T0)


def test_tiers_divide_each_other_and_only_the_last_lives_as_long_as_the_job() -> None:
    assert all(coarse % fine == 0 for fine, coarse in itertools.pairwise(TIERS))
    assert set(RETENTION_S) == {RAW, *TIERS[:-1]}


def test_a_10s_point_closes_when_a_reading_passes_its_end(clock: FakeClock) -> None:
    rollup = Rollup()
    assert feed(rollup, clock, 10) == []  # 0..9: all inside [T0, T0 + 10)
    closed = rollup.add(reading(clock.wall()))  # T0 + 10
    assert [(b.tier, b.at, b.n) for b in closed] == [(10, T0, 10)]


def test_a_point_keeps_the_mean_and_the_max_of_gauges_and_the_last_counter(clock: FakeClock) -> None:
    rollup = Rollup()
    for cpu, rss in [(10.0, 100 * MIB), (30.0, 900 * MIB), (20.0, 200 * MIB)]:
        rollup.add(reading(clock.wall(), cpu=cpu, rss=rss))
        clock.advance(1.0)
    (point,) = rollup.add(reading(T0 + 10))
    assert point.cpu.mean == pytest.approx(20.0) and point.cpu.peak == 30.0
    assert point.rss.mean == pytest.approx(400 * MIB) and point.rss.peak == 900 * MIB  # the spike survives
    assert (point.cpu_time_s, point.io_read, point.io_write) == (2.0, 20, 40)  # the last reading's


def test_tiers_nest_a_10_minute_point_is_the_sum_of_its_readings(clock: FakeClock) -> None:
    rollup = Rollup()
    closed = feed(rollup, clock, 600)
    closed += rollup.add(reading(clock.wall()))  # T0 + 600 closes every tier's first point
    by_tier = {tier: [b for b in closed if b.tier == tier] for tier in TIERS}
    assert [len(by_tier[t]) for t in TIERS] == [60, 10, 1]
    assert [b.at for b in by_tier[60]] == [T0 + 60 * i for i in range(10)]
    (ten_minutes,) = by_tier[600]
    assert ten_minutes.n == 600 and ten_minutes.cpu_time_s == 599.0
    assert sum(b.n for b in by_tier[10]) == sum(b.n for b in by_tier[60]) == 600


def test_a_spike_of_one_second_survives_in_every_tier(clock: FakeClock) -> None:
    rollup = Rollup()
    closed = feed(rollup, clock, 333)
    closed += rollup.add(reading(clock.wall(), rss=7000 * MIB))
    clock.advance(1.0)
    closed += feed(rollup, clock, 300)
    closed += rollup.flush()
    for tier in TIERS:
        assert max(b.rss.peak or 0 for b in closed if b.tier == tier) == 7000 * MIB
    (ten_minutes,) = [b for b in closed if b.tier == 600 and b.at == T0]
    assert ten_minutes.rss.mean == pytest.approx(100 * MIB + 6900 * MIB / 600)


def test_merges_weigh_each_gauge_by_the_readings_it_holds() -> None:
    busy, idle = Bucket(10, T0), Bucket(10, T0 + 10)
    busy.add(reading(T0, cpu=100.0))
    for i in range(9):
        idle.add(reading(T0 + 10 + i, cpu=0.0))
    minute = Bucket(60, T0)
    minute.merge(busy)
    minute.merge(idle)
    assert minute.n == 10
    assert minute.cpu.mean == pytest.approx(10.0)  # 1 reading at 100 %, 9 at 0 %: not (100 + 0) / 2
    assert minute.cpu.peak == 100.0


def test_a_gauge_known_in_some_readings_averages_those_only() -> None:
    point = Bucket(10, T0)
    point.add(reading(T0, gpu_util=80.0, gpus=(GpuReading(0, 80.0, 4 * MIB),)))
    point.add(reading(T0 + 1))  # NVML had no reading yet: unknown, not 0 %
    point.add(reading(T0 + 2, gpu_util=40.0, gpus=(GpuReading(0, 40.0, 8 * MIB), GpuReading(1, 10.0, None))))
    assert point.gpu_util.mean == pytest.approx(60.0)
    util, mem = point.gpus[0]
    assert (util.mean, mem.mean, mem.peak) == (60.0, 6 * MIB, 8 * MIB)
    assert point.gpus[1][1].mean is None  # memory NVML could not tell stays unknown


def test_a_stored_gauge_merges_as_the_readings_it_stood_for() -> None:
    gauge = Gauge.stored(mean=20.0, peak=50.0, count=3)
    gauge.merge(Gauge.stored(mean=60.0, peak=60.0, count=1))
    assert (gauge.mean, gauge.peak, gauge.count) == (30.0, 60.0, 4)
    assert Gauge.stored(None, None, 5).mean is None


def test_flush_closes_every_open_point_at_the_end_of_a_run(clock: FakeClock) -> None:
    rollup = Rollup()
    assert feed(rollup, clock, 5) == []
    closed = rollup.flush()
    assert [(b.tier, b.at, b.n) for b in closed] == [(10, T0, 5), (60, T0, 5), (600, T0, 5)]
    assert rollup.flush() == []


def test_a_gap_closes_the_points_it_passes(clock: FakeClock) -> None:
    rollup = Rollup()
    feed(rollup, clock, 3)
    closed = rollup.add(reading(T0 + 3600.5))  # the machine slept an hour
    assert [(b.tier, b.at) for b in closed] == [(10, T0), (60, T0), (600, T0)]
    assert [(b.tier, b.at) for b in rollup.flush()] == [(10, T0 + 3600), (60, T0 + 3600), (600, T0 + 3600)]


def test_a_wall_clock_stepped_back_lands_in_the_open_point(clock: FakeClock) -> None:
    rollup = Rollup()
    feed(rollup, clock, 5)
    assert rollup.add(reading(T0 - 30)) == []
    (point, *_) = rollup.flush()
    assert (point.at, point.n) == (T0, 6)


def test_expiry_keeps_raw_an_hour_10s_a_day_1min_a_week_and_10min_for_ever() -> None:
    now = T0 + 40 * 86400
    assert expiry(now) == {RAW: now - 3600, 10: now - 86400, 60: now - 7 * 86400}


@pytest.mark.parametrize(
    ("span_s", "points", "tier"),
    [
        (3600, 600, RAW),  # 6 s a point: raw readings are the only tier that fine
        (3600, 300, 10),
        (86400, 600, 60),  # 144 s a point
        (86400, 100, 600),
        (30 * 86400, 600, 600),
        (30 * 86400, None, RAW),  # no number asked: the finest
        (0, 600, RAW),
    ],
)
def test_choose_tier_gives_at_least_the_points_asked_for(
    span_s: float, points: int | None, tier: int
) -> None:
    assert choose_tier(span_s, points) == tier


def _points(tier: int, start: float, end: float) -> list[Bucket]:
    step = tier or 1
    out = []
    at = start
    while at < end:
        out.append(Bucket.of(reading(at)) if tier == RAW else Bucket(tier, at))
        out[-1].n = out[-1].n or 1
        at += step
    return out


def fetch_from(sources: dict[int, list[Bucket]], asked: list[int] | None = None) -> Fetch:
    """The store's reads over in-memory tiers: points with lo <= at and end <= hi."""

    def fetch(tier: int, lo: float, hi: float) -> list[Bucket]:
        found = [b for b in sources.get(tier, []) if lo <= b.at and b.end <= hi]
        if asked is not None:
            asked.append(len(found))
        return found

    return fetch


def test_stitch_covers_the_whole_run_from_the_tiers_that_still_hold_each_part() -> None:
    now = T0 + 30 * 86400  # 30 days on: each tier holds its retention, the newest not yet rolled up
    sources = {
        RAW: _points(RAW, now - 3600, now),
        10: _points(10, now - 86400, now - 10),
        60: _points(60, now - 7 * 86400, now - 60),
        600: _points(600, T0, now - 600),
    }
    for preferred in (RAW, 10, 60, 600):
        history = stitch(fetch_from(sources), preferred)
        starts = [b.at for b in history]
        assert starts == sorted(starts) and len(set(starts)) == len(starts)
        assert history[0].at == T0 and history[-1].at == now - 1
        assert all(a.end <= b.at for a, b in itertools.pairwise(history))  # no overlap
    asked: list[int] = []
    assert {b.tier for b in stitch(fetch_from(sources, asked), 600)} == {600, 60, 10, RAW}
    assert asked == [4319, 9, 5, 10]  # 30 days of 10 min points, then only the stretch each finer fills


def test_stitch_from_a_time_starts_with_the_point_holding_it() -> None:
    sources = {RAW: _points(RAW, T0 + 600, T0 + 700), 10: _points(10, T0, T0 + 600), 600: []}
    history = stitch(fetch_from(sources), 10, since=T0 + 333)
    assert history[0].at == T0 + 330 and history[-1].at == T0 + 699


def test_stitch_of_a_run_shorter_than_any_point_is_its_raw_readings() -> None:
    raw = _points(RAW, T0, T0 + 7)
    assert stitch(fetch_from({RAW: raw}), 600) == raw


def test_thin_merges_neighbours_keeping_weights_and_peaks() -> None:
    points = [Bucket.of(reading(T0 + i, rss=(900 if i == 77 else 100) * MIB)) for i in range(1000)]
    thinned = thin(points, T0, T0 + 1000, 100)
    assert len(thinned) == 100
    assert sum(b.n for b in thinned) == 1000
    assert max(b.rss.peak or 0 for b in thinned) == 900 * MIB
    assert thin(points[:50], T0, T0 + 50, 100) == points[:50]

"""The other sources of progress (a heartbeat's info, the hooks' in-process records) and the choice
between all of them; the step clock; the records the hooks write, read back whatever a job leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.probes.pyhooks import read_progress
from jobwarden.progress.model import Bar, HookProgress, Progress, Reading
from jobwarden.progress.sources import (
    choose,
    heartbeat_reading,
    in_process,
    in_process_activity,
    output_candidate,
)
from jobwarden.progress.stepclock import StepClock


def bar(
    n: int, total: int | None = 1000, desc: str | None = "Epoch 3", position: int = 0, **kw: object
) -> Bar:
    return Bar(
        kind=str(kw.pop("kind", "tqdm")),
        n=n,
        total=total,
        unit="it",
        desc=desc,
        position=position,
        closed=bool(kw.pop("closed", False)),
        postfix=kw.pop("postfix", None),
    )  # type: ignore[arg-type]


# --- heartbeat -----------------------------------------------------------------------------------------


def test_a_heartbeat_with_step_total_and_loss() -> None:
    got = heartbeat_reading({"step": 85, "total": 1000, "loss": 0.0116, "note": "text", "ok": True})
    assert got == Reading(step=85, total=1000, unit=None, metrics=(("loss", 0.0116),), format="heartbeat")
    assert heartbeat_reading({"step": 3, "unit": "batch"}).unit == "batch"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "info", [{}, {"note": "alive"}, {"step": "85"}, {"step": True}, {"loss": float("nan")}]
)
def test_a_heartbeat_that_says_nothing_of_progress_is_none(info: dict[str, object]) -> None:
    assert heartbeat_reading(info) is None


@given(
    st.dictionaries(st.text(max_size=20), st.none() | st.booleans() | st.integers() | st.floats() | st.text())
)
def test_any_heartbeat_info_is_read_without_error(info: dict[str, object]) -> None:
    got = heartbeat_reading(info)
    if got is not None:
        assert got.step is None or got.step >= 0
        assert all(isinstance(v, float) and v == v for _, v in got.metrics)


# --- in-process bars -------------------------------------------------------------------------------------


def test_the_lowest_rank_and_its_outer_open_bar() -> None:
    records = [
        HookProgress(pid=20, rank=1, at=1.0, bars=(bar(500),)),
        HookProgress(
            pid=10, rank=0, at=1.0, bars=(bar(7, 8, "Validation", position=1), bar(450, postfix="loss=0.5"))
        ),
        HookProgress(pid=30, rank=None, at=1.0, bars=()),
    ]
    got = in_process(records)
    assert got is not None and got.rank == 0
    assert (got.reading.step, got.reading.total, got.reading.label, got.reading.epoch) == (
        450,
        1000,
        "Epoch 3",
        3.0,
    )
    assert dict(got.reading.metrics) == {"loss": 0.5}
    assert in_process_activity(records) == ((20, "tqdm", 0, 500), (10, "tqdm", 1, 7), (10, "tqdm", 0, 450))


def test_the_bar_closed_last_when_none_is_open() -> None:
    got = in_process([HookProgress(1, None, 1.0, (bar(1000, closed=True),))])
    assert got is not None and got.reading.closed and got.reading.finished


def test_a_heartbeat_step_wins_and_the_others_add_their_metrics() -> None:
    beat = Reading(step=85, total=1000, format="heartbeat", metrics=(("loss", 0.01),))
    hooks = in_process([HookProgress(1, None, 1.0, (bar(450, postfix="acc=0.9"),))])
    out = output_candidate(Reading(step=440, total=1000, label="Epoch 3"), None)  # the log a frame behind
    got = choose(beat, hooks, out)
    assert got is not None and (got.source, got.reading.step) == ("heartbeat", 85)
    only_loss = Reading(step=None, format="heartbeat", metrics=(("loss", 0.01),))
    mixed = choose(only_loss, hooks, out)
    assert mixed is not None and mixed.observed == "in-process"
    assert dict(mixed.reading.metrics) == {"acc": 0.9, "loss": 0.01}


def test_the_log_may_be_ahead_of_the_hooks_on_the_same_bar() -> None:
    """The hooks write at most twice a second: a loop that stops right after a step leaves the log's last
    frame a little ahead; both count the same counter, the larger wins."""
    hooks = in_process([HookProgress(1, None, 1.0, (bar(618),))])
    ahead = output_candidate(Reading(step=620, total=1000, label="Epoch 3"), None)
    got = choose(None, hooks, ahead)
    assert got is not None and (got.observed, got.reading.step) == ("log", 620)
    behind = output_candidate(Reading(step=600, total=1000, label="Epoch 3"), None)
    exact = choose(None, hooks, behind)
    assert exact is not None and (exact.observed, exact.reading.step) == ("in-process", 618)
    other = output_candidate(Reading(step=9000, total=10000, label="download"), None)
    kept = choose(None, hooks, other)
    assert kept is not None and kept.reading.step == 618


def test_hf_dicts_seen_in_the_log_name_the_bar_seen_in_process() -> None:
    hooks = in_process([HookProgress(1, None, 1.0, (bar(10, 32, None),))])
    out = output_candidate(Reading(step=10, total=32, format="hf", metrics=(("loss", 0.5),)), None)
    got = choose(None, hooks, out, output_metrics=(("loss", 0.5),))
    assert got is not None and got.reading.format == "hf" and dict(got.reading.metrics) == {"loss": 0.5}


def test_no_source_no_progress() -> None:
    assert choose(None, None, None) is None
    assert in_process([]) is None


# --- the records the hooks write, read back ----------------------------------------------------------------


def test_a_record_as_the_hooks_write_it(tmp_path: Path) -> None:
    record = {
        "pid": 42,
        "rank": 0,
        "at": 1.5,
        "bars": [
            {
                "kind": "tqdm",
                "n": 450,
                "total": 1000,
                "unit": "it",
                "desc": "Epoch 3",
                "pos": 0,
                "closed": False,
                "postfix": "loss=0.5",
            },
            {
                "kind": "keras",
                "n": 3,
                "total": None,
                "unit": "step",
                "desc": None,
                "pos": 0,
                "closed": False,
                "metrics": {"loss": 0.25, "bad": "x"},
            },
            {"kind": "other", "n": 1},
            "junk",
        ],
        "epoch": 2,
    }
    (tmp_path / "42.progress").write_text(json.dumps(record))
    got = read_progress(tmp_path, 42)
    assert got is not None and (got.pid, got.rank, got.at, got.epoch) == (42, 0, 1.5, 2)
    assert [b.kind for b in got.bars] == ["tqdm", "keras"]
    assert got.bars[1].metrics == (("loss", 0.25),)
    assert read_progress(tmp_path, 43) is None  # none written
    (tmp_path / "44.progress").write_text(json.dumps({**record, "pid": 45}))
    assert read_progress(tmp_path, 44) is None  # another process's claim


@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_whatever_a_job_leaves_as_a_record_is_read_without_error(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "7.progress").write_bytes(data)
        got = read_progress(Path(tmp), 7)
    assert got is None or got.pid == 7


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
        max_leaves=30,
    )
)
def test_any_json_in_a_record_is_read_without_error(value: object) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        body = {"pid": 7, "at": 1.0, "bars": value} if not isinstance(value, dict) else {**value, "pid": 7}
        (Path(tmp) / "7.progress").write_text(json.dumps(body))
        got = read_progress(Path(tmp), 7)
    if got is not None:
        assert all(isinstance(b.n, int) for b in got.bars)


# --- the step clock --------------------------------------------------------------------------------------


def test_the_rate_is_measured_on_the_clock_of_observation() -> None:
    clock = StepClock(window_s=30.0)
    for second in range(61):
        clock.observe(float(second), second * 5)  # 5 steps a second
    assert clock.rate(60.0) == pytest.approx(5.0)
    assert clock.interval() == pytest.approx(1.0)


def test_a_counter_that_stops_sees_its_rate_fall() -> None:
    clock = StepClock(window_s=30.0)
    for second in range(31):
        clock.observe(float(second), second * 10)
    before = clock.rate(30.0)
    after = clock.rate(90.0)
    assert before is not None and after is not None and after < before / 2
    assert clock.still_for(90.0) == pytest.approx(60.0)


def test_a_slow_counter_is_measured_over_its_last_change() -> None:
    clock = StepClock(window_s=30.0)
    for minute in range(5):
        clock.observe(minute * 600.0, minute)  # a step every ten minutes
    assert clock.rate(2400.0) == pytest.approx(1 / 600)


def test_a_reset_or_another_bar_starts_the_measure_over() -> None:
    clock = StepClock()
    for second in range(10):
        clock.observe(float(second), second * 100, identity="Epoch #")
    assert clock.rate(9.0) is not None
    clock.observe(10.0, 3, identity="Epoch #")  # went back: the next epoch
    assert clock.rate(10.0) is None
    clock.observe(11.0, 50, identity="Validation")
    assert clock.rate(11.0) is None and clock.count == 1


def test_a_progress_at_its_total_has_no_eta() -> None:
    p = Progress(1000, 1000, 5.0, "it", None, (), "output", "tqdm", 1.0)
    assert (p.fraction, p.eta_s, p.finished) == (1.0, None, True)
    q = p._replace(step=450)
    assert q.eta_s == pytest.approx(110.0)
    assert q.to_json(now=2.0)["eta_s"] == 110.0

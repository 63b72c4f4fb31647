"""The exposition over a real store without processes: which jobs it exports, the text format's rules
(contiguous families, escaping, counters), and a store that cannot be read."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwarden.control.prometheus import RECENT_S, exposition
from jobwarden.control.promtext import Family, escape_label_value, format_value, render
from jobwarden.model import JobSpec, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store
from jobwarden.store.db import write

NOW = 1_800_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as s:
        yield s


def fill_ended(store: Store, count: int, ended_at: float) -> None:
    """`count` ended jobs, inserted in one transaction (the Store's API would take a commit each)."""
    conn = store._db.conn
    first = int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0]) + 1
    ids = range(first, first + count)
    with write(conn):
        conn.executemany(
            "INSERT INTO jobs (id, name, command, cwd, created_at) VALUES (?, ?, ?, '/w', ?)",
            [(i, f"old{i}", json.dumps(["true"]), ended_at - 10) for i in ids],
        )
        conn.executemany(
            "INSERT INTO runs (job_id, n, state, started_at, ended_at, exit_code) VALUES (?, 1, ?, ?, ?, 0)",
            [(i, JobState.SUCCEEDED.value, ended_at - 5, ended_at) for i in ids],
        )


def add_job(store: Store, name: str, state: JobState, ended_at: float | None) -> int:
    job_id, _ = store.create_job(JobSpec(("python", "t.py"), "/w", name, {}), {}, NOW - 100)
    store.update_run(job_id, 1, state=state, started_at=NOW - 90, ended_at=ended_at)
    return job_id


def exported_ids(text: str) -> list[str]:
    [info] = [f for f in text_string_to_metric_families(text) if f.name == "jobwarden_job_info"]
    return [s.labels["job_id"] for s in info.samples]


def test_only_live_jobs_and_those_ended_within_a_day_are_exported(store: Store) -> None:
    fill_ended(store, 1000, NOW - RECENT_S - 60)
    recent = add_job(store, "recent", JobState.FAILED, NOW - RECENT_S + 60)
    lost = add_job(store, "lost", JobState.LOST, None)
    text = exposition(store, ProcFS(), NOW)
    assert exported_ids(text) == [str(recent), str(lost)]
    totals = {
        s.labels["state"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "jobwarden_runs_ended"
        for s in f.samples
    }
    assert totals == {"succeeded": 1000, "failed": 1, "stopped": 0}  # the totals count every run kept


def test_a_name_with_quotes_backslashes_and_newlines_survives_the_round_trip(store: Store) -> None:
    name = 'a "quoted"\\ name\nover two lines'
    job_id = add_job(store, name, JobState.RUNNING, None)
    store.update_run(job_id, 1, state=JobState.LOST)  # no shim to ask about
    [info] = [
        f
        for f in text_string_to_metric_families(exposition(store, ProcFS(), NOW))
        if f.name.endswith("_info")
    ]
    assert [s.labels["job_name"] for s in info.samples] == [name]


def test_a_store_that_cannot_be_read_says_so_and_still_answers(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    store.close()
    parsed = {f.name: f for f in text_string_to_metric_families(exposition(store, ProcFS(), NOW))}
    assert set(parsed) == {"jobwarden_store_up", "jobwarden_scrape_duration_seconds"}
    assert parsed["jobwarden_store_up"].samples[0].value == 0


def test_each_family_is_written_whole_in_the_order_given() -> None:
    first, second = Family("x_total", "counter", "a\\b\nc"), Family("y", "gauge", "why")
    first.add(1, job_id="1")
    second.add(2.5)
    first.add(3, job_id="2")
    lines = render([first, second]).splitlines()
    assert lines == [
        "# HELP x_total a\\\\b\\nc",
        "# TYPE x_total counter",
        'x_total{job_id="1"} 1',
        'x_total{job_id="2"} 3',
        "# HELP y why",
        "# TYPE y gauge",
        "y 2.5",
    ]
    parsed = list(text_string_to_metric_families(render([first, second])))
    assert [(f.name, f.type) for f in parsed] == [("x", "counter"), ("y", "gauge")]


def test_values_and_label_escapes() -> None:
    assert [format_value(v) for v in (True, 0, 7, 0.25, math.inf, -math.inf)] == [
        "1",
        "0",
        "7",
        "0.25",
        "+Inf",
        "-Inf",
    ]
    assert format_value(math.nan) == "NaN"
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    with pytest.raises(ValueError, match="_total"):
        Family("jobwarden_restarts", "counter", "a counter without _total")
    with pytest.raises(ValueError, match="unsupported"):
        Family("jobwarden_x", "summary", "not written by jobwarden")


def test_progress_families_the_counter_always_the_rate_and_eta_while_live(store: Store) -> None:
    from jobwarden.progress.model import Progress

    live = add_job(store, "live", JobState.RUNNING, None)
    ended = add_job(store, "ended", JobState.FAILED, NOW - 60)
    silent = add_job(store, "silent", JobState.SUCCEEDED, NOW - 60)
    shown = Progress(450, 1000, 5.4, "it", None, (("loss", 0.5),), "output", "tqdm", NOW - 1)
    store.set_progress(live, 1, shown)
    store.set_progress(ended, 1, shown._replace(step=620, total=None))
    values = {
        (s.name, s.labels["job_id"]): s.value
        for f in text_string_to_metric_families(exposition(store, ProcFS(), NOW))
        for s in f.samples
        if s.name.startswith(("jobwarden_job_progress", "jobwarden_job_step", "jobwarden_job_eta"))
    }
    assert values == {
        ("jobwarden_job_progress_step", str(live)): 450,
        ("jobwarden_job_progress_total", str(live)): 1000,
        ("jobwarden_job_progress_ratio", str(live)): 0.45,
        ("jobwarden_job_step_rate", str(live)): 5.4,
        ("jobwarden_job_eta_seconds", str(live)): pytest.approx(550 / 5.4),
        ("jobwarden_job_progress_step", str(ended)): 620,
    }
    assert str(silent) not in {job for _, job in values}  # no progress shown: none exported, never 0


def test_each_ranks_step_rate_while_live(store: Store) -> None:
    from jobwarden.store.rankfile import write_ranks

    live = add_job(store, "live", JobState.RUNNING, None)
    ended = add_job(store, "ended", JobState.FAILED, NOW - 60)
    rows = [{"rank": 0, "rate": 5.5, "where": "collective"}, {"rank": 1, "rate": None, "where": "computing"}]
    for job in (live, ended):
        store.layout.run_dir(job, 1).mkdir(parents=True, exist_ok=True)
        assert write_ranks(store.layout.ranks_file(job, 1), rows, NOW)
    found = [
        (s.labels, s.value)
        for f in text_string_to_metric_families(exposition(store, ProcFS(), NOW))
        for s in f.samples
        if s.name == "jobwarden_rank_step_rate"
    ]
    # a rank with no rate of its own has no series (unknown is not zero); an ended run none at all
    assert found == [({"job_id": str(live), "job_name": "live", "rank": "0"}, 5.5)]

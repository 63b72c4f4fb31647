"""Ranks of a real distributed job (torchrun, gloo on 127.0.0.1) under `jobwarden run`: `status --json`'s
`ranks` rows, the text table and each rank's step rate in `/metrics`, and `straggler` on the rank the
others wait for — a rank that sleeps in each step (named with the sleep as its why, within 60 s at the
default settings, and resolved once it catches up), a rank moved into a 0.1-CPU cgroup (named with its
quota), a rank whose main thread waits on a thread of its own (named from the ranks' flight recorders) —
and no straggler for balanced ranks beside a CPU hog outside the job.

Handshakes: rank 0 says "ready" once the ranks step together; a finding is polled for with a deadline.
Every process started here is reaped (the hog by the test, the jobs by `jobwarden stop`, the fixture
checks)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MEASURED, Jobwarden
from tests.integration.test_prometheus import promtool_check
from tests.integration.test_rootcause import free_port
from tests.integration.test_speed import SPEED_S, cpu_quota_cgroup, finding, ready, stop
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
JOB = Path(__file__).resolve().parent / "jobs" / "ranks_job.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
WHERE = {"computing", "collective", "data", "io", "idle", "unknown"}
NAMED_WITHIN_S = 60.0  # DESIGN: a straggler is named within a minute of its onset, at the default settings


@pytest.fixture(autouse=True)
def private_tmp(jw: Jobwarden, tmp_path: Path) -> None:
    jw.env["TMPDIR"] = str(tmp_path)  # torchrun leaves folders there


def start_ranks(jw: Jobwarden, *args: str, nproc: int = 2) -> int:
    command = (str(TORCHRUN), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1")
    port = ("--master-port", str(free_port()))
    return int(jw.start(*command, *port, str(JOB), *args)["id"])


def ranks_of(jw: Jobwarden, job: int) -> list[dict[str, Any]]:
    return list(jw.status(job)["ranks"])


def rank_pid(jw: Jobwarden, job: int, rank: int) -> int:
    rows = eventually("rank rows", lambda: ranks_of(jw, job), SPEED_S)
    return int(next(r["pid"] for r in rows if r["rank"] == rank))


@pytest.fixture
def tenth_cpu_cgroup() -> Iterator[Path]:
    with cpu_quota_cgroup("jobwarden-rank-test", 10_000) as path:  # 0.1 CPU
        yield path


def test_a_rank_that_sleeps_is_the_straggler_until_it_catches_up(jw: Jobwarden, tmp_path: Path) -> None:
    caught_up = tmp_path / "caught-up"
    job = start_ranks(jw, "sleep", "1", str(caught_up))
    try:
        ready(jw, job)
        onset = time.monotonic()
        slow = rank_pid(jw, job, 1)
        f = eventually("straggler on rank 1", lambda: finding(jw, job, "straggler"), SPEED_S)
        named_after = time.monotonic() - onset
        MEASURED.setdefault("straggler", {})["a sleeping rank named after ready (s)"] = named_after
        assert named_after <= NAMED_WITHIN_S, named_after
        assert f["rank"] == 1 and f["pids"][0] == slow, f
        assert f["title"].startswith("Rank 1 is a straggler: ")
        assert f["title"].endswith("× slower per step than the others"), f["title"]
        assert any(e.startswith("rank 0 (pid ") and "in collectives" in e for e in f["evidence"]), f
        assert any("slept in" in e and "clock_nanosleep" in e for e in f["evidence"]), f
        # the rows of `status`: both ranks, each with its own step counter and where it is
        rows = eventually("both ranks with steps", lambda: _stepping(ranks_of(jw, job), 2), SPEED_S)
        assert [r["rank"] for r in rows] == [0, 1] and rows[1]["pid"] == slow
        assert all(r["where"] in WHERE and r["local_rank"] == r["rank"] for r in rows)
        assert {r["node"] for r in rows} == {socket.gethostname().split(".")[0]}
        text = jw("status", str(job), check=True).stdout
        assert "  RANK      PID     STEP      RATE  COLLECTIVE              WHERE" in text, text
        assert "[straggler] Rank 1" in text and " all_reduce " in text
        metrics = jw("metrics", str(job), "--prometheus", check=True).stdout
        assert f'jobwarden_rank_step_rate{{job_id="{job}",job_name=' in metrics and ',rank="1"}' in metrics
        promtool_check(metrics)  # the per-rank series as Prometheus reads them
        # it catches up: the finding is resolved, never shown as current
        caught_up.touch()
        eventually("straggler resolved", lambda: finding(jw, job, "straggler") is None, SPEED_S)
        assert any(g["rule"] == "straggler" and g["resolved_at"] for g in jw.status(job)["findings"])
    finally:
        stop(jw, job)
    assert jw.status(job)["ranks"] == []  # an ended run's ranks are nowhere


def test_a_rank_half_as_slow_again_is_named_within_a_minute_of_its_onset(
    jw: Jobwarden, tmp_path: Path
) -> None:
    """DESIGN's goal: a 1.5x straggler named within 60 s of its onset. Rank 1 turns to 6 matrix products a
    step where rank 0 does 4 (and both their all_reduce): the others wait a third of their time."""
    switch = tmp_path / "heavier"
    job = start_ranks(jw, "heavier-after", "1", str(switch))
    try:
        ready(jw, job)
        assert finding(jw, job, "straggler") is None
        switch.touch()
        onset = time.monotonic()
        f = eventually("straggler on rank 1", lambda: finding(jw, job, "straggler"), SPEED_S)
        named_after = time.monotonic() - onset
        MEASURED.setdefault("straggler", {})["a 1.5x rank named after its onset (s)"] = named_after
        assert named_after <= NAMED_WITHIN_S, named_after
        assert f["rank"] == 1, f
        factor = float(f["title"].split("about ")[1].split("×")[0])
        MEASURED["straggler"]["the 1.5x rank's factor as named"] = factor
        assert 1.3 <= factor <= 2.5, f["title"]  # 1.6-1.7 measured here; more on a loaded machine
    finally:
        stop(jw, job)


def test_a_rank_under_a_tenth_of_a_cpu_is_the_straggler_named_with_its_quota(
    jw: Jobwarden, tenth_cpu_cgroup: Path
) -> None:
    job = start_ranks(jw, "quota", "1", str(tenth_cpu_cgroup))
    try:
        ready(jw, job)
        slow = rank_pid(jw, job, 1)
        assert str(slow) in (tenth_cpu_cgroup / "cgroup.procs").read_text().split()
        seen: list[Any] = []

        def named_with_its_quota() -> dict[str, Any] | None:
            found = finding(jw, job, "straggler")
            seen[:] = [found, ranks_of(jw, job)]
            return found if found and any("quota of 0.1 CPUs" in e for e in found["evidence"]) else None

        try:
            f = eventually("straggler on rank 1 with its quota", named_with_its_quota, SPEED_S)
        except pytest.fail.Exception:
            pytest.fail(f"no straggler naming the quota; last seen (finding, ranks): {seen}")
        assert f["rank"] == 1 and f["pids"][0] == slow, f
        assert "Why: its cpu cgroup's quota of 0.1 CPUs" in f["summary"] and "quota" in f["remedy"]
    finally:
        stop(jw, job)


def test_a_rank_that_waits_on_its_own_device_is_named_from_the_flight_recorders(jw: Jobwarden) -> None:
    """Rank 1's main thread waits each step for work it handed to a thread of its own (as a rank waits
    for its GPU's stream): blocked in a futex like rank 0 in its all_reduce, so the looks at the main
    threads cannot tell them apart. When each rank called its collectives can."""
    job = start_ranks(jw, "device", "1")
    try:
        ready(jw, job)
        onset = time.monotonic()
        slow = rank_pid(jw, job, 1)
        f = eventually("straggler on rank 1", lambda: finding(jw, job, "straggler"), SPEED_S)
        MEASURED.setdefault("straggler", {})["a rank waiting on its device named after ready (s)"] = (
            time.monotonic() - onset
        )
        assert f["rank"] == 1 and f["pids"][0] == slow, f
        assert "(their flight recorders)" in f["summary"], f["summary"]
        recorded = [e for e in f["evidence"] if "its flight recorder (when it called its collectives)" in e]
        assert [e.split(" (pid")[0] for e in recorded] == ["rank 0", "rank 1"], f["evidence"]
        assert "the one waited for in 0 of " in recorded[0], recorded
        assert "waited for a later rank 0% of the time" in recorded[1], recorded
        assert "not waiting for the other ranks: it waits on work of its own" in f["summary"], f["summary"]
        assert f"py-spy dump --native --pid {slow}" in f["remedy"], f["remedy"]
        # each rank's newest collective, as its recorder named it: the ranks keep step. The rows are
        # rewritten every 2 s, and the finding may be a tick ahead of them
        calls = eventually("each rank's newest collective", lambda: _called(ranks_of(jw, job)), SPEED_S)
        assert all((c["op"], c["group"]) == ("all_reduce", "0") and c["rate"] > 0 for c in calls), calls
    finally:
        stop(jw, job)


def test_balanced_ranks_beside_a_cpu_hog_have_no_straggler(jw: Jobwarden) -> None:
    job = start_ranks(jw, "balanced")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        ready(jw, job)
        eventually("both ranks with steps", lambda: _stepping(ranks_of(jw, job), 2), SPEED_S)
        # the speed watch judges every 4 s over 20 s: 30 s is a window and a half, seven judgements
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert finding(jw, job, "straggler") is None
            time.sleep(1.0)  # looking, not waiting for something: the deadline bounds it
        assert not any(f["rule"] == "straggler" for f in jw.status(job)["findings"])
    finally:
        hog.kill()
        hog.wait()
        stop(jw, job)


def _called(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    calls = [r["collective"] for r in rows]
    return calls if calls and all(calls) else None


def _stepping(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]] | None:
    return rows if len(rows) == n and all(isinstance(r["step"], int) for r in rows) else None

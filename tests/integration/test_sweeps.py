"""Sweeps (issue 21): `run --after JOB` starts once JOB has succeeded and is cancelled when it fails;
`run --queue NAME` waits for one of the queue's places (`jobwarden queue NAME --parallel N`), first come
first served. Each job says what it waits for, and each start is a handshake on a FIFO."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, kill_shim, make_fifo, read_fifo, wait_pid_gone, write_fifo
from tests.support import eventually

pytestmark = pytest.mark.integration


def gated(fifo: Path, gate: Path, name: str) -> tuple[str, ...]:
    """A job that says `name` on `fifo` once it runs, then waits to be let go through `gate`."""
    return ("sh", "-c", f"echo {name} > {fifo}; read x < {gate}")


def test_after_waits_for_the_job_to_succeed(jw: Jobwarden, tmp_path: Path) -> None:
    started, gate = make_fifo(tmp_path / "started"), make_fifo(tmp_path / "gate")
    first = jw.start(*gated(started, gate, "prep"), options=("--name", "prep"))
    assert read_fifo(started) == "prep\n"
    second = jw.start("sh", "-c", f"echo train > {started}", options=("--after", "prep"))
    assert second["state"] == "queued" and second["pid"] is None
    status = jw.status(second["id"])
    assert status["queued_reason"] == "waiting for job 1 (prep) to succeed (--after): it is running"
    assert f"waiting for job {first['id']} (prep)" in jw("status", str(second["id"])).stdout
    write_fifo(gate)  # prep succeeds
    assert read_fifo(started) == "train\n"
    assert jw("wait", str(second["id"])).returncode == 0
    assert jw.status(second["id"])["state"] == "succeeded"


def test_a_failed_dependency_cancels_the_job_with_a_clear_state_and_reason(
    jw: Jobwarden, tmp_path: Path
) -> None:
    started, gate = make_fifo(tmp_path / "started"), make_fifo(tmp_path / "gate")
    jw.start("sh", "-c", f"echo prep > {started}; read x < {gate}; exit 3", options=("--name", "prep"))
    read_fifo(started)
    job = jw.start("touch", str(tmp_path / "never"), options=("--after", "1", "--restart", "on-failure"))
    write_fifo(gate)  # prep fails
    assert jw("wait", str(job["id"])).returncode == 1
    status = jw.status(job["id"])
    assert (status["state"], status["end_reason"], status["pid"]) == ("failed", "dependency-failed", None)
    assert status["error"] == (
        "not started: job 1 (prep) failed (exit code 3), and this job was to run after it succeeded"
    )
    cause = jw.json("explain", str(job["id"]))["findings"][0]
    assert cause["rule"] == "dependency-failed" and "jobwarden explain 1" in cause["remedy"]
    assert jw.json("ps", "--all")[1]["finding"] == "dependency-failed"
    assert not (tmp_path / "never").exists() and status["runs"] == [status["runs"][0]]  # never restarted


def test_after_names_a_job_that_exists(jw: Jobwarden) -> None:
    result = jw("run", "--after", "nosuch", "--", "true")
    assert result.returncode == 1 and result.stderr.startswith("jobwarden: no job 'nosuch'")


def test_a_queue_runs_one_at_a_time_in_order_and_parallel_widens_it(jw: Jobwarden, tmp_path: Path) -> None:
    started = make_fifo(tmp_path / "started")
    gates = [make_fifo(tmp_path / f"gate{i}") for i in (1, 2, 3)]  # one each: a write reaches its own job
    jobs = [jw.start(*gated(started, gates[i - 1], f"job{i}"), options=("--queue", "q")) for i in (1, 2, 3)]
    assert read_fifo(started) == "job1\n"
    second = jw.status(jobs[1]["id"])
    assert second["state"] == "queued"
    assert second["queued_reason"] == "waiting for a place in queue 'q': 1 of 1 taken (job 1)"
    assert jw.status(jobs[2]["id"])["queued_reason"].endswith("(job 1), 1 ahead in line")
    assert jw.json("queue", "q") == {"name": "q", "parallel": 1, "running": 1, "waiting": 2}

    write_fifo(gates[0])  # job 1 ends: job 2, first in line, takes its place
    assert read_fifo(started) == "job2\n"
    assert jw.status(jobs[2]["id"])["state"] == "queued"
    assert jw("queue", "q", "--parallel", "2").stdout == "q: 1 of 2 running, 1 waiting\n"
    assert read_fifo(started) == "job3\n"  # a second place: job 3 starts at once
    write_fifo(gates[1])
    write_fifo(gates[2])
    for job in jobs:
        assert jw("wait", str(job["id"])).returncode == 0
    assert jw.json("queue") == [{"name": "q", "parallel": 2, "running": 0, "waiting": 0}]


def test_a_queued_job_stopped_before_its_turn_never_starts(jw: Jobwarden, tmp_path: Path) -> None:
    started, gate = make_fifo(tmp_path / "started"), make_fifo(tmp_path / "gate")
    first = jw.start(*gated(started, gate, "first"), options=("--queue", "q"))
    read_fifo(started)
    waiting = jw.start("touch", str(tmp_path / "never"), options=("--queue", "q"))
    jw("stop", str(waiting["id"]), check=True)
    assert jw.status(waiting["id"])["state"] == "stopped"
    write_fifo(gate)
    assert jw("wait", str(first["id"])).returncode == 0
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("queue", "--parallel", "2"), "jobwarden: queue --parallel needs the queue's NAME"),
        (("queue", "q", "--parallel", "0"), "jobwarden: bad --parallel '0': a queue runs 1 or more at once"),
        (
            ("run", "--queue", "", "--", "true"),
            "jobwarden: bad queue name '': printable text, at most 64 characters",
        ),
    ],
)
def test_bad_queue_input_is_a_one_line_error(jw: Jobwarden, args: tuple[str, ...], message: str) -> None:
    result = jw(*args)
    assert result.returncode == 2 and result.stderr.splitlines()[0] == message


def test_after_a_lost_job_waits_while_its_processes_run_and_fails_once_they_are_gone(
    jw: Jobwarden, tmp_path: Path
) -> None:
    started, gate = make_fifo(tmp_path / "started"), make_fifo(tmp_path / "gate")
    prep = jw.start(*gated(started, gate, "prep"), options=("--name", "prep"))
    assert read_fifo(started) == "prep\n"
    job = jw.start("touch", str(tmp_path / "never"), options=("--after", "prep"))
    kill_shim(jw, prep["id"])  # prep runs on unsupervised: adopted, its end would still be recorded
    lost_but_running = "waiting for job 1 (prep) to succeed (--after): it is lost (its supervisor died)"
    wanted = lost_but_running + "; its processes still run: `jobwarden adopt 1` records its end"
    eventually(wanted, lambda: jw.status(job["id"])["queued_reason"] == wanted, 60, every_s=0.05)
    os.kill(prep["pid"], signal.SIGKILL)  # now nothing of prep runs: it can never succeed
    wait_pid_gone(prep["pid"])
    waited = jw("wait", str(job["id"]), "--timeout", "60s")
    assert waited.returncode == 1, (waited.returncode, jw.status(job["id"]))
    status = jw.status(job["id"])
    assert (status["state"], status["end_reason"], status["pid"]) == ("failed", "dependency-failed", None)
    assert status["error"] == (
        "not started: job 1 (prep) was lost: its supervisor died and none of its processes runs, so its end "
        "was never recorded, and this job was to run after it succeeded"
    )
    cause = jw.json("explain", str(job["id"]))["findings"][0]
    assert cause["rule"] == "dependency-failed"
    assert "jobwarden rerun 1" in cause["remedy"], cause
    assert not (tmp_path / "never").exists()

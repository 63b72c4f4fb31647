"""`--keep-running PATTERN`: a process meant to outlive the job (a TensorBoard) is left running at the
job's end, is no orphan and no stray, is listed as kept, and `jobwarden stop JOB` ends it (issue 21)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jobwarden.store import Store
from tests.conftest import Jobwarden, alive, make_fifo, read_fifo, start_time, wait_pid_gone

pytestmark = pytest.mark.integration

# a stand-in for `tensorboard --logdir runs`, and a leaked loop that must still be ended
SERVER = "import sys, time; time.sleep(600)"


def test_a_kept_process_outlives_the_job_is_listed_as_kept_and_stop_ends_it(
    jw: Jobwarden, tmp_path: Path
) -> None:
    pids = make_fifo(tmp_path / "pids")
    script = (
        f"{sys.executable} -c '{SERVER}' tensorboard-standin & board=$!; "
        f"{sys.executable} -c '{SERVER}' leaked-loop & loop=$!; "
        f'echo "$board $loop" > {pids}'
    )
    job = jw.start("sh", "-c", script, options=("--keep-running", "tensorboard-stand"))
    board, loop = (int(p) for p in read_fifo(pids).split())
    board_start = start_time(board)
    assert board_start is not None
    assert jw("wait", str(job["id"])).returncode == 0

    assert alive(board, board_start)  # not killed at the job's end
    wait_pid_gone(loop)  # the leak is ended as always
    status = jw.status(job["id"])
    assert [k["pid"] for k in status["kept"]] == [board]
    assert status["kept"][0]["cmdline"].endswith("tensorboard-standin")
    assert [o["pid"] for o in status["orphans_left"]] == [loop]  # the kept one is no orphan
    text = jw("status", str(job["id"])).stdout
    assert f"  kept         pid {board} (" in text and f"jobwarden stop {job['id']} ends it" in text
    assert board not in [s["pid"] for s in jw.json("orphans")]  # nor a stray
    if status["containment"].startswith("cgroup"):  # moved out: the job's cgroup goes with the job
        job_cgroup = Path(status["containment"].split(" ", 1)[1]).name
        assert job_cgroup not in Path(f"/proc/{board}/cgroup").read_text()

    refused = jw("rm", str(job["id"]))
    assert refused.returncode == 1
    assert "processes it kept running (--keep-running) still run" in refused.stderr

    stopped = jw("stop", str(job["id"]))
    assert stopped.returncode == 0
    assert f"ended what it kept running (--keep-running): pid {board}" in stopped.stdout
    wait_pid_gone(board)
    assert jw("rm", str(job["id"])).returncode == 0


def test_a_stop_of_the_running_job_ends_what_it_would_have_kept(jw: Jobwarden, tmp_path: Path) -> None:
    pids = make_fifo(tmp_path / "pids")
    script = f"{sys.executable} -c '{SERVER}' tensorboard-standin & echo $! > {pids}; wait"
    job = jw.start("sh", "-c", script, options=("--keep-running", "tensorboard"))
    board = int(read_fifo(pids))
    jw("stop", str(job["id"]), check=True)  # `stop` asks for the whole job to end
    wait_pid_gone(board)
    assert jw.status(job["id"])["kept"] == []


def test_a_bad_pattern_is_refused_at_run(jw: Jobwarden) -> None:
    result = jw("run", "--keep-running", "tensor(board", "--", "true")
    assert result.returncode == 2
    assert result.stderr.startswith("jobwarden: --keep-running 'tensor(board': not a regular expression")


def test_a_pattern_that_backtracks_for_ever_keeps_nothing_and_the_end_is_recorded_on_time(
    jw: Jobwarden, tmp_path: Path
) -> None:
    """Issue 25, harm 7: `(a|a)+$` against 34 a's and a `!` backtracks 2**34 ways; `re` ran for ever in
    the shim's end, the end was never recorded and `stop` hung. A normal pattern beside it still keeps."""
    pids = make_fifo(tmp_path / "pids")
    bait = "a" * 34 + "!"
    script = (
        f"{sys.executable} -c '{SERVER}' {bait} & bait=$!; "
        f"{sys.executable} -c '{SERVER}' tensorboard-standin & board=$!; "
        f'echo "$bait $board" > {pids}'
    )
    options = ("--keep-running", "(a|a)+$", "--keep-running", "tensorboard-stand")
    job = jw.start("sh", "-c", script, options=options)
    bait_pid, board = (int(p) for p in read_fifo(pids).split())
    board_start = start_time(board)
    assert board_start is not None

    assert jw("wait", str(job["id"]), timeout=60).returncode == 0  # the end is recorded
    wait_pid_gone(bait_pid)  # kept by nothing: ended with the job
    assert alive(board, board_start)
    status = jw.status(job["id"])
    assert [k["pid"] for k in status["kept"]] == [board]
    with Store(jw.home) as store:
        slow = [e for e in store.events(job["id"], 1) if e.kind == "keep-running-too-slow"]
    assert [e.data["pattern"] for e in slow] == ["(a|a)+$"]
    assert jw("stop", str(job["id"]), timeout=60).returncode == 0
    wait_pid_gone(board)


def test_a_pattern_with_a_repeat_inside_a_repeat_is_refused_at_run(jw: Jobwarden) -> None:
    result = jw("run", "--keep-running", "(a+)+$", "--", "true")
    assert result.returncode == 2
    assert result.stderr.startswith("jobwarden: --keep-running '(a+)+$': a repeat inside a repeat")
    assert "Traceback" not in result.stderr

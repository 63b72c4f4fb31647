"""The root cause on the real ML stack: PyTorch's DataLoader, torchrun (gloo on 127.0.0.1),
ProcessPoolExecutor, loky and joblib. Each failure is reproduced with the real library
(tests/integration/jobs/mlstack.py), and `explain` must name the worker or rank that failed first, with
its pid and rank, and rank no wrapper exception above it. Healthy jobs must raise nothing.

torch, joblib and loky come from the project's `realworld` extra (scripts/setup --dev): missing, these
tests fail at import, as CI requires."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import joblib  # noqa: F401 - the extra must be installed: fail here, never skip
import loky  # noqa: F401
import pytest
import torch  # noqa: F401

from jobwarden.rules import mltext
from tests.conftest import Jobwarden, make_fifo, read_fifo
from tests.support import eventually

pytestmark = pytest.mark.integration
JOB = Path(__file__).resolve().parent / "jobs" / "mlstack.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
WRAPPERS = ("ChildFailedError", "BrokenProcessPool", "TerminatedWorkerError", "exited unexpectedly")


@pytest.fixture(autouse=True)
def private_tmp(jw: Jobwarden, tmp_path: Path) -> None:
    # torchrun leaves a torchelastic_* folder in $TMPDIR after every run
    jw.env["TMPDIR"] = str(tmp_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(scenario: str, *args: str, ranks: int = 2) -> tuple[str, ...]:
    return (
        str(TORCHRUN),
        "--nproc_per_node",
        str(ranks),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(JOB),
        scenario,
        *args,
    )


def run_to_end(jw: Jobwarden, command: tuple[str, ...], *options: str) -> dict[str, Any]:
    """`run --wait` the job; its explain report, with `job` (the id) added."""
    ran = jw("run", "--json", "--wait", *options, "--", *command)
    assert ran.returncode != 127, ran.stderr
    job = json.loads(ran.stdout)["id"]
    report = dict(jw.json("explain", str(job)))
    report["job"] = job
    return report


def read_lines(fifo: Path, n: int, jw: Jobwarden | None = None, job: int | None = None) -> list[str]:
    """`n` announcements from the FIFO, read through one opening (read_fifo). Without them
    in time, the failure says what jobwarden knew of the job (a start that never got there)."""
    try:
        return read_fifo(fifo, timeout_s=90, lines=n).splitlines()
    except TimeoutError as err:
        if jw is None or job is None:
            raise
        said = jw("explain", str(job)).stdout + jw("logs", str(job), "-n", "40").stdout
        raise AssertionError(f"{err}; the job:\n{said}") from err


def announced(path: Path) -> list[tuple[int, str]]:
    """(pid, what) of each line the scenario wrote to its --ready file."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(line.split()[0]), line.split(maxsplit=2)[2]) for line in lines]


def assert_root(report: dict[str, Any], rule: str, pid: int, rank: int | None = None) -> dict[str, Any]:
    first = dict(report["findings"][0])
    assert first["rule"] == rule, report["findings"]
    assert first["pids"][0] == pid, first
    assert first["rank"] == rank, first
    wrapped = [f for f in report["findings"][1:] if any(w in f["title"] + f["summary"] for w in WRAPPERS)]
    assert all(f["rule"] != "python-exception" for f in wrapped), report["findings"]
    return first


# --- PyTorch DataLoader ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "signal_name"),
    [("dl-sigkill", "SIGKILL"), ("dl-segv", "SIGSEGV"), ("dl-sigbus", "SIGBUS")],
)
def test_dataloader_worker_death(jw: Jobwarden, tmp_path: Path, scenario: str, signal_name: str) -> None:
    ready = tmp_path / "ready"
    report = run_to_end(jw, (sys.executable, str(JOB), scenario, "--ready", str(ready)))
    ((worker, what),) = announced(ready)
    assert what == "dl-worker"
    first = assert_root(report, "dataloader-worker-killed", worker)
    assert signal_name in first["title"]
    if signal_name == "SIGBUS":
        assert all(s in first["remedy"] for s in ("--shm-size", "--ipc=host", "num_workers", "file_system"))


def test_dataloader_worker_oom_killed_under_mem_limit(jw: Jobwarden, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = (sys.executable, str(JOB), "dl-oom", "--ready", str(ready), "--cap-mb", "6000")
    report = run_to_end(jw, command, "--mem-limit", "1500M")
    ((worker, _),) = announced(ready)
    first = report["findings"][0]
    assert first["rule"] == "oom-kill", report["findings"]
    assert worker in first["pids"]
    assert all(f["rule"] != "python-exception" for f in report["findings"])


# --- torchrun ----------------------------------------------------------------------------------------


def test_torchrun_rank_that_raises(jw: Jobwarden) -> None:
    report = run_to_end(jw, torchrun("rank-raises"))
    failed_rank = mltext.child_failed(jw.output(report["job"]).splitlines())
    assert failed_rank is not None
    # the hooks wrote the rank's TORCHELASTIC_ERROR_FILE as @record would: torchrun's report quotes it
    assert failed_rank.root_cause.error_file is not None
    assert failed_rank.root_cause.traceback is not None
    assert failed_rank.root_cause.traceback.exc_type == "ValueError"
    first = assert_root(report, "python-exception", failed_rank.root_cause.pid, 1)
    assert "ValueError" in first["title"]
    assert any(e.startswith("raised at") and "mlstack.py" in e for e in first["evidence"])
    assert any("ChildFailedError" in e for e in first["evidence"])  # the wrapper, as evidence


def test_torchrun_rank_killed_from_outside(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "ready")
    job = jw.start(*torchrun("rank-killed", "--ready", str(fifo)))
    rank1 = int(read_fifo(fifo, timeout_s=90).split()[0])
    os.kill(rank1, signal.SIGKILL)
    jw("wait", str(job["id"]), "--timeout", "90s")
    report = jw.json("explain", str(job["id"]))
    first = assert_root(report, "killed-externally", rank1, 1)
    assert any("rank 0" in e and "SIGTERM" in e for e in first["evidence"])  # torchrun's teardown
    statuses = {p["pid"]: p for p in jw.status(job["id"])["processes"]}
    assert not statuses  # nothing of it is left


def test_torchrun_rank_that_hangs_outside_the_collective(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "ready")
    options = ("--hang-timeout", "4s", "--on-hang", "stop", "--grace", "2s")
    job = jw.start(*torchrun("rank-hangs", "--ready", str(fifo)), options=options)
    lines = read_lines(fifo, 2)
    sleeper = next(int(line.split()[0]) for line in lines if "sleeping" in line)
    jw("wait", str(job["id"]), "--timeout", "120s")
    report = jw.json("explain", str(job["id"]))
    first = assert_root(report, "collective-hang", sleeper, 1)
    assert "all_reduce" in first["title"]


@pytest.mark.parametrize(
    ("scenario", "ranks", "culprit_says", "title"),
    [
        # rank 1 calls broadcast #6 where rank 0 calls all_reduce #6: both wait in a collective
        (
            "rank-wrong-op",
            2,
            "broadcast",
            "Rank 1 called broadcast (mlstack.py:{}) where rank 0 waits in all_reduce #6",
        ),
        # rank 1 skipped one all_reduce and sleeps: rank 0's last one (#5) waits for it
        ("rank-skips", 2, "skipped", "Rank 1 never called all_reduce #5, where rank 0 waits (mlstack.py:"),
        (
            "rank-barrier",
            3,
            "barrier",
            "Rank 2 called barrier (mlstack.py:{}) where ranks 0 and 1 wait in all_reduce #6",
        ),
    ],
)
def test_torchrun_collective_hang_names_the_culprit_from_the_flight_recorder(
    jw: Jobwarden, tmp_path: Path, scenario: str, ranks: int, culprit_says: str, title: str
) -> None:
    fifo = make_fifo(tmp_path / "ready")
    options = ("--hang-timeout", "4s", "--on-hang", "stop", "--grace", "2s")
    job = jw.start(*torchrun(scenario, "--ready", str(fifo), ranks=ranks), options=options)
    said = [line.split(maxsplit=2) for line in read_lines(fifo, ranks, jw, job["id"])]
    culprit, rank = next((int(pid), int(r)) for pid, r, what in said if what == culprit_says)
    jw("wait", str(job["id"]), "--timeout", "120s")
    report = jw.json("explain", str(job["id"]))
    first = assert_root(report, "collective-hang", culprit, rank)
    assert first["title"].startswith(title.format(call_line(culprit_says))), first
    assert set(first["pids"]) == {int(pid) for pid, _, _ in said}
    assert any("flight recorder" in e for e in first["evidence"]), first


def test_a_collective_hang_is_found_while_the_ranks_answer_the_straggler_polls(
    jw: Jobwarden, tmp_path: Path
) -> None:
    """The rank watch asks every rank for its flight recorder every 10 s, and each answer writes ~20 KB
    once the ranks made 256 collectives (here 301 before they part): more I/O than counts as progress. A
    hang window longer than that (25 s here, minutes in real use) must still find the hang: the answers
    are jobwarden's work, not the job's."""
    fifo = make_fifo(tmp_path / "ready")
    options = ("--hang-timeout", "25s", "--on-hang", "stop", "--grace", "2s")
    job = jw.start(*torchrun("rank-wrong-op", "--steps", "300", "--ready", str(fifo)), options=options)
    said = [line.split(maxsplit=2) for line in read_lines(fifo, 2, jw, job["id"])]
    culprit = next(int(pid) for pid, _, what in said if what == "broadcast")

    def polled() -> list[dict[str, Any]] | None:  # each rank answered a poll during the hang
        rows = jw.status(job["id"])["ranks"]
        at = [(r["collective"] or {}).get("seq") for r in rows]
        return rows if at == [302, 302] else None  # both at the call that parts them

    eventually("each rank's newest collective from its recorder, during the hang", polled, 60)
    jw("wait", str(job["id"]), "--timeout", "120s")
    first = assert_root(jw.json("explain", str(job["id"])), "collective-hang", culprit, 1)
    assert first["title"].startswith("Rank 1 called broadcast"), first


@pytest.mark.parametrize(
    ("scenario", "ranks", "culprit_says", "title"),
    [
        ("rank-wrong-op", 2, "broadcast", "Rank 1 waits in broadcast where rank 0 waits in all_reduce"),
        ("rank-barrier", 3, "barrier", "Rank 2 waits in barrier where ranks 0 and 1 wait in all_reduce"),
    ],
)
def test_torchrun_collective_hang_from_the_stacks_alone(
    jw: Jobwarden, tmp_path: Path, scenario: str, ranks: int, culprit_says: str, title: str
) -> None:
    jw.env["TORCH_FR_BUFFER_SIZE"] = "0"  # the user turned the recorder off: the stacks are all there is
    fifo = make_fifo(tmp_path / "ready")
    options = ("--hang-timeout", "4s", "--on-hang", "stop", "--grace", "2s")
    job = jw.start(*torchrun(scenario, "--ready", str(fifo), ranks=ranks), options=options)
    said = [line.split(maxsplit=2) for line in read_lines(fifo, ranks, jw, job["id"])]
    culprit, rank = next((int(pid), int(r)) for pid, r, what in said if what == culprit_says)
    jw("wait", str(job["id"]), "--timeout", "120s")
    first = assert_root(jw.json("explain", str(job["id"])), "collective-hang", culprit, rank)
    assert first["title"] == title, first
    assert not any("flight recorder" in e for e in first["evidence"]), first


def test_dump_shows_each_ranks_flight_recorder_and_where_they_part(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "ready")
    job = jw.start(*torchrun("rank-wrong-op", "--ready", str(fifo)))
    said = {what: int(pid) for pid, _, what in (line.split(maxsplit=2) for line in read_lines(fifo, 2))}

    def parted() -> Any:
        dumped = jw("dump", str(job["id"]))
        assert dumped.returncode == 0, dumped.stderr
        return dumped if "where they part" in dumped.stdout else None

    # each rank announces its call just before it makes it: a dump may come in between
    dumped = eventually("a dump that says where the ranks part", parted, 60, every_s=0)
    jw("stop", str(job["id"]))
    assert "PyTorch flight recorder, the last 3 collectives of each rank" in dumped.stdout
    assert (
        f"rank 1 (pid {said['broadcast']}): all_reduce #4 done, all_reduce #5 done, broadcast #6 waiting"
        in (dumped.stdout)
    )
    line = (
        f"  where they part: Rank 1 called broadcast (mlstack.py:{call_line('broadcast')}) where rank 0 waits"
    )
    assert line in dumped.stdout


def call_line(op: str) -> int | None:
    """The line of mlstack.py that calls `dist.<op>(`: the call site the finding names."""
    lines = JOB.read_text().splitlines()
    return next((n for n, line in enumerate(lines, 1) if f"dist.{op}(" in line), None)


def test_torchrun_agent_killed_leaves_no_rank_behind(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "ready")
    job = jw.start(*torchrun("rank-hangs", "--ready", str(fifo)))
    ranks = {int(line.split()[0]) for line in read_lines(fifo, 2)}
    os.kill(job["pid"], signal.SIGKILL)  # the elastic agent itself: its ranks lose their parent
    jw("wait", str(job["id"]), "--timeout", "90s")
    report = jw.json("explain", str(job["id"]))
    assert_root(report, "killed-externally", job["pid"])
    orphans = next(f for f in report["findings"] if f["rule"] == "orphans-left")
    assert ranks <= set(orphans["pids"])
    # every rank contained: the jw fixture fails the test if any process of the job is still alive


# --- ProcessPoolExecutor, loky, joblib --------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "rule"),
    [
        ("ppe-sigkill", "killed-externally"),
        ("ppe-segv", "native-crash"),
        ("loky-sigkill", "killed-externally"),
        ("loky-segv", "native-crash"),
    ],
)
def test_pool_worker_dies_mid_task(jw: Jobwarden, tmp_path: Path, scenario: str, rule: str) -> None:
    ready = tmp_path / "ready"
    report = run_to_end(jw, (sys.executable, str(JOB), scenario, "--ready", str(ready)))
    ((worker, what),) = announced(ready)
    assert what == "pool-worker"
    first = assert_root(report, rule, worker)
    assert any(w in " ".join(first["evidence"]) for w in ("BrokenProcessPool", "TerminatedWorkerError"))


# --- healthy jobs raise nothing ---------------------------------------------------------------------


def test_fsync_checkpoints_in_a_loop_are_no_hang(jw: Jobwarden) -> None:
    command = (sys.executable, str(JOB), "fsync-checkpoint", "--iterations", "600")
    report = run_to_end(jw, command, "--hang-timeout", "2s")
    assert report["state"] == "succeeded"
    assert report["findings"] == []


def test_a_resource_tracker_ending_after_the_main_process_is_no_orphan(jw: Jobwarden, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    report = run_to_end(jw, (sys.executable, str(JOB), "resource-tracker", "--ready", str(ready)))
    assert report["state"] == "succeeded"
    assert report["findings"] == []
    assert any("resource-tracker" in what for _, what in announced(ready))

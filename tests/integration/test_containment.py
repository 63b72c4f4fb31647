"""Whole-tree containment: the five kinds of descendants never outlive the job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, alive, make_fifo, read_fifo, start_time

pytestmark = pytest.mark.integration
JOB = str(Path(__file__).parent / "jobs" / "descendants.py")
KINDS = {"plain", "setsid", "double_fork_setsid", "double_fork", "interpreter"}


@pytest.fixture(params=["cgroup-if-writable", "no-cgroup"])
def containment(request: pytest.FixtureRequest, jw: Jobwarden) -> str:
    """Every containment test runs twice: with a cgroup where one is writable, and with subreaper and
    /proc scanning alone (what a container without a writable cgroup gets)."""
    if request.param == "no-cgroup":
        jw.env["JOBWARDEN_CGROUP"] = "off"
    return str(request.param)


def _descendants(message: str) -> dict[str, tuple[int, int]]:
    pids = dict(item.split("=") for item in message.split())
    assert set(pids) == KINDS
    found = {}
    for kind, pid in pids.items():
        start = start_time(int(pid))
        assert start is not None, f"{kind} descendant {pid} is not running"
        found[kind] = (int(pid), start)
    return found


def test_stop_ends_every_kind_of_descendant(jw: Jobwarden, tmp_path: Path, containment: str) -> None:
    fifo = make_fifo(tmp_path / "ready")
    job = jw.start(sys.executable, JOB, str(fifo), "wait", options=("--name", "tree"))
    descendants = _descendants(read_fifo(fifo))

    result = jw("stop", "tree", "--grace", "5s")

    assert result.returncode == 0, result.stderr
    survivors = [kind for kind, (pid, start) in descendants.items() if alive(pid, start)]
    assert survivors == []
    status = jw.status(job["id"])
    assert status["state"] == "stopped"
    assert status["signal"] == "SIGTERM"
    assert status["processes"] == []
    assert status["containment"].startswith("subreaper") or containment != "no-cgroup"


def test_main_exit_ends_every_kind_of_descendant_and_lists_them(
    jw: Jobwarden, tmp_path: Path, containment: str
) -> None:
    fifo = make_fifo(tmp_path / "ready")
    job = jw.start(sys.executable, JOB, str(fifo), "exit")
    descendants = _descendants(read_fifo(fifo))

    assert jw("wait", str(job["id"])).returncode == 0

    assert [kind for kind, (pid, start) in descendants.items() if alive(pid, start)] == []
    status = jw.status(job["id"])
    assert status["state"] == "succeeded"
    assert status["exit_code"] == 0
    orphan_pids = {o["pid"] for o in status["orphans_left"]}
    assert {pid for pid, _ in descendants.values()} <= orphan_pids
    assert any(f["rule"] == "orphans-left" for f in status["findings"])


def test_job_ignoring_sigterm_is_killed_after_the_grace(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "ready")
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write('ready\\n'); time.sleep(3600)"
    )
    job = jw.start(sys.executable, "-c", code, str(fifo))
    read_fifo(fifo)

    result = jw.json("stop", str(job["id"]), "--grace", "1s")

    assert result["state"] == "stopped"
    assert result["signal"] == "SIGKILL"
    assert result["survivors"] == []
    assert not alive(job["pid"], start_time(job["pid"]) or -1)

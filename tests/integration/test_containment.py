"""Whole-tree containment: the five kinds of descendants never outlive the job."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Jobwarden, alive, make_fifo, read_fifo, start_time
from tests.support import eventually

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


def _pids(status: dict[str, Any]) -> set[int]:
    return {int(p["pid"]) for p in status["processes"]}


def _job_markers(pid: int) -> dict[str, str]:
    """The JOBWARDEN_* variables of a job's process, as a process that wants to pass for it would copy."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (e.decode().partition("=") for e in entries if e.startswith(b"JOBWARDEN_"))
    return {key: value for key, _, value in pairs}


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process of another user needs root")
def test_a_marked_process_of_another_user_not_below_the_job_is_no_member(jw: Jobwarden) -> None:
    """Root reads every user's environment: a process of another user that carries a root job's markers
    was listed in `status`, counted against --mem-limit, and its SIGSTOP was a `process-stopped` finding.
    A process of the job's own user with the same markers, started after it, is the control: once a full
    scan has taken it, the same scan has looked at the other user's one."""
    nobody = pwd.getpwnam("nobody").pw_uid
    job = jw.start("sleep", "600")
    markers = {"PATH": os.environ["PATH"], **_job_markers(job["pid"])}
    assert {"JOBWARDEN_JOB_ID", "JOBWARDEN_RUN", "JOBWARDEN_HOME"} <= set(markers)
    started: list[subprocess.Popen[bytes]] = []
    try:
        impostor = subprocess.Popen(["sleep", "600"], env=markers, user=nobody, start_new_session=True)
        started.append(impostor)
        os.kill(impostor.pid, signal.SIGSTOP)
        control = subprocess.Popen(["sleep", "600"], env=markers, start_new_session=True)
        started.append(control)

        def with_control() -> dict[str, Any] | None:
            status = jw.status(job["id"])
            return status if control.pid in _pids(status) else None

        # a full scan comes every FULL_SCAN_EVERY_S (10 s)
        status = eventually("the control process in the job's tree", with_control, 60, every_s=0.1)
        assert impostor.pid not in _pids(status)
        assert "process-stopped" not in {f["rule"] for f in status["findings"]}
        assert jw("stop", str(job["id"]), "--grace", "5s").returncode == 0
        assert control.wait(timeout=30) is not None  # a member: the stop ended it
        assert impostor.poll() is None  # not one: left alone
    finally:
        jw("stop", str(job["id"]), "--grace", "0")  # ended already, unless an assertion failed first
        for proc in started:
            proc.kill()
            proc.wait(timeout=30)

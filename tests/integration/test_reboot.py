"""A reboot ends every job (issue 21). A real reboot cannot happen in a test: what it leaves behind is made
instead, as it would be. Every process of the jobs is killed (SIGKILL, as at a shutdown), and the runs'
stored boot id is set to another boot's, as if they had been recorded before this boot began; the CLI reads
the real /proc/sys/kernel/random/boot_id of this one. Then: the runs are ended by the reboot and explained
so, and `jobwarden resume` starts again the jobs with a restart policy, once. `boot enable` writes its
systemd user unit into temporary XDG directories."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from jobwarden.store import Store
from tests.conftest import Jobwarden, kill_shim, make_fifo, read_fifo, wait_pid_gone
from tests.support import eventually

pytestmark = pytest.mark.integration
EARLIER_BOOT = "00000000-0000-4000-8000-000000000000"


def reboot(jw: Jobwarden, job_ids: list[int]) -> None:
    """What a reboot leaves: every process of the jobs dead, the runs recorded under an earlier boot."""
    for job_id in job_ids:
        pid = jw.status(job_id)["pid"]
        kill_shim(jw, job_id)
        os.kill(pid, signal.SIGKILL)  # the job is alone now (its shim is gone): the pid is still its own
        wait_pid_gone(pid)
    conn = sqlite3.connect(jw.home / "jobwarden.db")
    with conn:
        conn.execute("UPDATE runs SET boot_id = ?", (EARLIER_BOOT,))
    conn.close()


def test_runs_of_an_earlier_boot_are_ended_by_the_reboot_and_resume_restarts_those_that_ask(
    jw: Jobwarden,
) -> None:
    service = jw.start("sleep", "600", options=("--name", "svc", "--restart", "always"))
    once = jw.start("sleep", "600", options=("--name", "once"))
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert jw.status(service["id"])["state"] == "running"
    reboot(jw, [service["id"], once["id"]])

    listed = {j["id"]: j for j in jw.json("ps", "--all")}
    for job in (service, once):  # ended, never `lost` (nothing of them can be adopted)
        assert listed[job["id"]]["state"] == "failed"
        assert listed[job["id"]]["finding"] == "machine-rebooted"
    explained = jw.json("explain", str(once["id"]))
    cause = explained["findings"][0]
    assert cause["rule"] == "machine-rebooted" and cause["title"] == "ended by a reboot of the machine"
    assert f"the run's supervisor ran under boot id {EARLIER_BOOT}" in cause["evidence"]
    assert any(boot_id in line for line in cause["evidence"])
    assert "jobwarden rerun" in cause["remedy"]
    svc_cause = jw.json("explain", str(service["id"]))["findings"][0]
    assert svc_cause["rule"] == "machine-rebooted" and "jobwarden resume" in svc_cause["remedy"]

    resumed = jw.json("resume")
    by_id = {r["id"]: r for r in resumed}
    assert by_id[service["id"]]["started"] is True and by_id[service["id"]]["run"] == 2
    assert by_id[once["id"]]["started"] is False and "no --restart" in by_id[once["id"]]["why"]
    restarted = jw.status(service["id"])
    assert (restarted["run"], restarted["state"]) == (2, "running")
    assert restarted["pid"] == by_id[service["id"]]["pid"]
    assert jw.json("resume") == []  # once: the next look finds nothing more to do
    assert jw("resume").stdout == "no job was ended by a reboot\n"
    jw("stop", "svc", check=True)


def test_boot_enable_writes_a_systemd_user_unit_and_disable_removes_it(jw: Jobwarden) -> None:
    units = Path(jw.env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    unit, link = (
        units / "jobwarden-resume.service",
        units / "default.target.wants" / "jobwarden-resume.service",
    )
    enabled = jw.json("boot", "enable", "--method", "systemd")
    assert enabled["enabled"] is True and enabled["changed"] is True and enabled["where"] == str(unit)
    text = unit.read_text()
    assert f"ExecStart={sys.executable} -m jobwarden resume\n" in text
    assert f"Environment=JOBWARDEN_HOME={jw.home}\n" in text
    assert f"Environment=PATH={jw.env['PATH']}\n" in text
    assert "Type=oneshot\n" in text and "WantedBy=default.target\n" in text
    assert os.readlink(link) == str(unit)
    assert jw.json("boot", "enable", "--method", "systemd")["changed"] is False  # idempotent
    assert unit.read_text() == text
    assert jw("boot", "status", "--method", "systemd").stdout.startswith("jobwarden resume at boot: enabled")

    disabled = jw("boot", "disable", "--method", "systemd")
    assert disabled.stdout.startswith("jobwarden resume at boot: disabled (systemd: ")
    assert not unit.exists() and not link.is_symlink()
    again = jw("boot", "disable", "--method", "systemd")
    assert again.returncode == 0 and again.stdout.startswith("jobwarden resume at boot: already disabled")


# Each waits at a gate with the CLI loaded, then runs `resume`: the three act at the same moment.
_GATED_RESUME = """
import os, sys
from jobwarden.cli.main import main
gate = os.open(sys.argv[1], os.O_RDONLY)
ready = os.open(sys.argv[2], os.O_WRONLY)
os.write(ready, b"r")
os.close(ready)
os.read(gate, 1)  # end of file once the test closes the gate's writing end: all of them at once
os.close(gate)
sys.exit(main(["resume", "--json"]))
"""


def test_three_resumes_at_once_start_one_new_run(jw: Jobwarden, tmp_path: Path) -> None:
    # boot scripts, cron and a user may all run `resume` at once: exactly one of them starts the next run
    job = jw.start("sleep", "600", options=("--name", "svc", "--restart", "always"))
    reboot(jw, [job["id"]])
    gate, ready = make_fifo(tmp_path / "gate"), make_fifo(tmp_path / "ready")
    gate_fd = os.open(gate, os.O_RDWR)  # held open: the readers' opens never block, their reads do
    ready_fd = os.open(ready, os.O_RDWR)
    resumes = [
        subprocess.Popen(
            [sys.executable, "-c", _GATED_RESUME, str(gate), str(ready)],
            env=jw.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        arrived = b""
        while len(arrived) < 3:
            assert select.select([ready_fd], [], [], 60)[0], "the resumes never reached the gate"
            arrived += os.read(ready_fd, 3)
    finally:
        os.close(gate_fd)
        os.close(ready_fd)
    outputs = [p.communicate(timeout=120) for p in resumes]
    assert [p.returncode for p in resumes] == [0, 0, 0], outputs
    said = [r for out, _ in outputs for r in json.loads(out)]
    started = [r for r in said if r["started"]]
    assert [(r["id"], r["run"]) for r in started] == [(job["id"], 2)], said
    for r in said:
        if not r["started"]:
            assert r["why"] == "started again by another jobwarden resume, as run 2", r
    with Store(jw.home) as store:
        assert [(r.n, r.state) for r in store.runs(job["id"])] == [(1, "failed"), (2, "running")]
    assert jw.status(job["id"])["pid"] == started[0]["pid"]
    jw("stop", "svc", check=True)


def test_a_reboot_during_a_stops_grace_leaves_the_job_stopped(jw: Jobwarden, tmp_path: Path) -> None:
    ready = make_fifo(tmp_path / "ready")
    # it ignores SIGTERM: `stop` waits out its grace, and the machine reboots meanwhile
    script = f"trap '' TERM; echo up > {ready}; exec sleep 600"
    job = jw.start("sh", "-c", script, options=("--name", "svc", "--restart", "always"))
    assert read_fifo(ready) == "up\n"
    stopper = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "stop", "svc", "--grace", "1h"],
        env=jw.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # the shim has signalled; the grace runs
        eventually("the job stopping", lambda: jw.status(job["id"])["state"] == "stopping", 60, every_s=0.05)
    finally:
        stopper.kill()  # the reboot ends the waiting `stop` too
        stopper.wait()
    reboot(jw, [job["id"]])

    [resumed] = jw.json("resume")
    assert (resumed["id"], resumed["started"], resumed["run"]) == (job["id"], False, None)
    assert (
        resumed["why"] == "not started again: it was being stopped (jobwarden stop) when the machine rebooted"
    )
    status = jw.status(job["id"])
    assert (status["state"], status["run"], status["end_reason"]) == ("stopped", 1, "reboot")
    cause = jw.json("explain", str(job["id"]))["findings"][0]
    assert cause["rule"] == "machine-rebooted"
    assert "while `jobwarden stop` ended it" in cause["summary"] and "resume" not in cause["remedy"]
    assert jw.json("resume") == []

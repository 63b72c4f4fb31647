"""Findings with a life, on real jobs: a finding that stops being true is resolved with the moment, and
`ps`, the web's list and job JSON, and `explain` say so; a run that recovered and then succeeded is told
as such, never with a root cause. Cases: a process stopped and continued (SIGSTOP/SIGCONT), a quiet spell
longer than the hang window and then output (with its `recovered` notification), an idle GPU used again
(fake NVML), and a job that only writes and fsyncs, printing nothing, which is progress, not a hang."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from jobwarden.probes import fakenvml
from tests.conftest import Jobwarden
from tests.integration.webtools import Client, web_server
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
CORPUS = Path(__file__).resolve().parent / "jobs" / "corpus.py"
PY = sys.executable


def finding(jw: Jobwarden, job: int, rule: str) -> dict[str, Any] | None:
    return next((f for f in jw.status(job)["findings"] if f["rule"] == rule), None)


def listed(jw: Jobwarden, job: int) -> dict[str, Any]:
    return dict(next(j for j in jw.json("ps", "--all") if j["id"] == job))


def web_views(jw: Jobwarden, job: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job as the web's list shows it, and its page's JSON."""
    with web_server(jw.home) as served:
        client = Client(served)
        row = next(j for j in client.get("/api/v1/jobs").json() if j["id"] == job)
        return row, client.get(f"/api/v1/jobs/{job}").json()


def assert_recovered(jw: Jobwarden, job: int, rule: str, word: str) -> dict[str, Any]:
    """The run succeeded after `rule` stopped being true: no verdict in any list, and explain tells it."""
    assert listed(jw, job)["finding"] is None
    report = jw.json("explain", str(job))
    assert report["state"] == "succeeded"
    first = report["findings"][0]
    assert first["rule"] == rule and first["resolved_at"] is not None and first["at"] is not None
    assert report["verdict"].startswith(f"{word} ") and report["verdict"].endswith(
        ", then recovered; succeeded"
    )
    text = jw("explain", str(job), check=True).stdout
    assert "then recovered; succeeded" in text and "root cause" not in text
    row, page = web_views(jw, job)
    assert row["finding"] is None and page["findings"][0]["resolved_at"] is not None
    return report


def test_a_stopped_process_that_is_continued_is_no_longer_stopped(jw: Jobwarden, tmp_path: Path) -> None:
    done = tmp_path / "done"
    job = jw.start(
        PY,
        str(CORPUS),
        "ticking",
        "--seconds",
        "120",
        "--until",
        str(done),
        options=("--hang-timeout", "off"),
    )
    os.kill(job["pid"], signal.SIGSTOP)
    stopped = eventually("process-stopped", lambda: finding(jw, job["id"], "process-stopped"))
    assert stopped["resolved_at"] is None and stopped["pids"] == [job["pid"]]
    assert (listed(jw, job["id"])["finding"], listed(jw, job["id"])["finding_title"]) == (
        "process-stopped",
        stopped["title"],
    )
    row, _ = web_views(jw, job["id"])
    assert row["finding"] == "process-stopped"
    os.kill(job["pid"], signal.SIGCONT)
    resolved = eventually(
        "the finding resolved",
        lambda: (f := finding(jw, job["id"], "process-stopped")) and f["resolved_at"] and f,
    )
    assert listed(jw, job["id"])["finding"] is None  # ps shows only what is true now
    row, page = web_views(jw, job["id"])
    assert row["finding"] is None and [f["resolved_at"] for f in page["findings"]] == [
        resolved["resolved_at"]
    ]
    done.touch()
    assert jw("wait", str(job["id"]), "--timeout", "60s").returncode == 0
    assert_recovered(jw, job["id"], "process-stopped", "stopped")


def test_a_quiet_spell_then_output_is_a_hang_that_recovered(jw: Jobwarden, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    options = ("--hang-timeout", "2s", "--on-event", f"cat >> {events}; echo >> {events}")
    job = jw.start(PY, str(CORPUS), "quiet-then-talk", "--quiet-s", "8", options=options)
    hung = eventually("no-progress", lambda: finding(jw, job["id"], "no-progress"))
    assert hung["resolved_at"] is None
    assert listed(jw, job["id"])["finding"] == "no-progress"  # while it is true
    assert jw("wait", str(job["id"]), "--timeout", "60s").returncode == 0
    report = assert_recovered(jw, job["id"], "no-progress", "hung")
    assert report["findings"][0]["resolved_at"] > report["findings"][0]["at"]
    notes = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    assert [n["event"] for n in notes] == ["hung", "recovered", "succeeded"]
    assert "No progress" in notes[1]["finding"] and "hung " in notes[1]["finding"]


def test_an_idle_gpu_that_computes_again_is_no_longer_idle(jw: Jobwarden, tmp_path: Path) -> None:
    nvml, done = tmp_path / "nvml.json", tmp_path / "done"
    fakenvml.write_state(nvml, {"devices": [fakenvml.device(0, name="NVIDIA H100 80GB HBM3")]})
    jw.env["JOBWARDEN_FAKE_NVML"] = str(nvml)
    code = (  # holds 5 GiB of GPU 0 and keeps a CPU busy (so it is not hung) until told to end
        "import os, time\n"
        "from jobwarden.probes import fakenvml\n"
        f"fakenvml.hold({str(nvml)!r}, 0, os.getpid(), 5 << 30)\n"
        "end = time.monotonic() + 120\n"
        f"while time.monotonic() < end and not os.path.exists({str(done)!r}):\n"
        "    sum(range(10000))\n"
    )
    job = jw.start(PY, "-c", code, options=("--hang-timeout", "2s"))
    idle = eventually("gpu-idle", lambda: finding(jw, job["id"], "gpu-idle"))
    assert idle["resolved_at"] is None and listed(jw, job["id"])["finding"] == "gpu-idle"

    def busy(state: dict[str, Any]) -> None:
        state["devices"][0]["utilization"] = {"gpu": 90, "memory": 40}

    fakenvml.update_state(nvml, busy)
    eventually("gpu-idle resolved", lambda: (f := finding(jw, job["id"], "gpu-idle")) and f["resolved_at"])
    assert listed(jw, job["id"])["finding"] is None
    done.touch()
    assert jw("wait", str(job["id"]), "--timeout", "60s").returncode == 0
    assert_recovered(jw, job["id"], "gpu-idle", "GPU idle")


def test_a_job_that_only_writes_and_fsyncs_is_progressing(jw: Jobwarden) -> None:
    # 1.2 MiB/s into a file, fsynced, not a line of output: the watchdog reads the job's I/O every few
    # ticks (the window / 3 here), and each reading must count against the one before
    command = (PY, str(CORPUS), "fsync-quiet", "--seconds", "14", "--rate-mb", "1.2")
    ran = jw("run", "--json", "--wait", "--hang-timeout", "9s", "--", *command)
    job = json.loads(ran.stdout)["id"]
    report = jw.json("explain", str(job))
    assert (report["state"], report["findings"]) == ("succeeded", [])
    assert listed(jw, job)["finding"] is None

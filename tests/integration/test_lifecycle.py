"""Restarts, memory limits and GPU admission, through the real CLI and shim."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from jobwarden.probes import fakenvml
from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo
from tests.support import eventually

pytestmark = pytest.mark.integration
PY = sys.executable


def runs_of(jw: Jobwarden, job: str) -> list[dict[str, Any]]:
    return [jw.json("status", job, "--run", str(n)) for n in range(1, 20) if _has_run(jw, job, n)]


def _has_run(jw: Jobwarden, job: str, n: int) -> bool:
    return jw("status", job, "--run", str(n), "--json").returncode == 0


def test_on_failure_restarts_with_the_attempt_number_until_success(jw: Jobwarden, tmp_path: Path) -> None:
    # fails on attempts 1 and 2 (differently each time), succeeds on attempt 3
    code = (
        "import os, sys\n"
        "n = int(os.environ['JOBWARDEN_RUN'])\n"
        "print('attempt', n, flush=True)\n"
        "sys.exit(0 if n == 3 else 10 + n)\n"
    )
    opts = ("--restart", "on-failure", "--max-restarts", "5", "--restart-delay", "0.1s")
    result = jw("run", *opts, "--wait", "--", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    job = result.stdout.split()[0]
    runs = runs_of(jw, job)
    assert [(r["run"], r["state"], r["exit_code"]) for r in runs] == [
        (1, "failed", 11),
        (2, "failed", 12),
        (3, "succeeded", 0),
    ]
    for n in (1, 2, 3):
        assert jw.output(job, n) == f"attempt {n}\n"  # each attempt has its own log
    assert jw("logs", job, "--run", "2").stdout == "attempt 2\n"


def test_max_restarts_bounds_the_attempts(jw: Jobwarden) -> None:
    code = "import os, sys; sys.exit(int(os.environ['JOBWARDEN_RUN']))"  # a new exit code each time
    opts = ("--restart", "always", "--max-restarts", "2", "--restart-delay", "0.1s")
    result = jw("run", *opts, "--wait", "--", PY, "-c", code)
    job = result.stdout.split()[0]
    assert result.returncode == 3
    assert [r["exit_code"] for r in runs_of(jw, job)] == [1, 2, 3]


def test_the_same_exception_twice_is_not_restarted_again(jw: Jobwarden) -> None:
    code = "def load():\n    raise KeyError('model.layer4.weight')\nload()\n"
    opts = ("--restart", "on-failure", "--max-restarts", "5", "--restart-delay", "0.1s")
    result = jw("run", *opts, "--wait", "--", PY, "-c", code)
    job = result.stdout.split()[0]
    assert len(runs_of(jw, job)) == 2
    report = jw.json("explain", job)
    assert report["run"] == 2
    text = json.dumps(report["findings"])
    assert "KeyError" in text and "not restart" in text.lower()


def test_a_command_not_found_is_never_restarted(jw: Jobwarden, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nexec no-such-program-xyz\n")
    script.chmod(0o700)
    opts = ("--restart", "always", "--max-restarts", "5", "--restart-delay", "0.1s")
    result = jw("run", *opts, "--wait", "--", str(script))
    assert result.returncode == 127
    assert len(runs_of(jw, result.stdout.split()[0])) == 1


def test_stop_during_the_backoff_ends_the_job(jw: Jobwarden) -> None:
    job = jw.start("sh", "-c", "exit 3", options=("--restart", "always", "--restart-delay", "1h"))
    # run 1 ended; the shim waits an hour
    eventually("the job restarting", lambda: jw.status(job["id"])["state"] == "restarting", 60, every_s=0.1)
    jw("stop", str(job["id"]), check=True)
    assert jw.status(job["id"])["state"] == "stopped"
    assert len(runs_of(jw, str(job["id"]))) == 2


@pytest.mark.parametrize("containment", ["cgroup", "watchdog"])
def test_a_memory_hog_is_ended_under_mem_limit(jw: Jobwarden, containment: str) -> None:
    if containment == "cgroup" and not Path("/sys/fs/cgroup/memory").is_dir():
        pytest.skip("no cgroup v1 memory controller here")
    if containment == "watchdog":
        jw.env["JOBWARDEN_CGROUP"] = "off"
    hog = "b = bytearray()\nwhile True:\n    b += b'\\1' * (16 << 20)\n"
    result = jw("run", "--mem-limit", "128M", "--wait", "--", PY, "-c", hog)
    job = result.stdout.split()[0]
    assert result.returncode != 0
    finding = jw.json("explain", job)["findings"][0]
    assert finding["rule"] == "oom-kill", finding
    evidence = "\n".join(finding["evidence"])
    assert ("watchdog" if containment == "watchdog" else "cgroup") in evidence
    assert "128" in evidence  # the limit


def fake_gpus(path: Path, holders: dict[int, list[int]]) -> None:
    """Four fake GPUs (JOBWARDEN_FAKE_NVML), with `holders` listed as compute processes of 5 GiB each."""
    devices = [fakenvml.device(i, name="NVIDIA H100 80GB HBM3") for i in range(4)]
    for i, pids in holders.items():
        devices[i]["compute"] = [{"pid": pid, "used": 5 << 30} for pid in pids]
    fakenvml.write_state(path, {"devices": devices})


def test_gpus_are_claimed_and_pinned(jw: Jobwarden, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    fake_gpus(nvml, {0: [os.getpid()]})  # GPU 0 is busy (held by this test process: not a job)
    jw.env["JOBWARDEN_FAKE_NVML"] = str(nvml)
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    result = jw("run", "--gpus", "2", "--wait", "--", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    assert jw.output(result.stdout.split()[0]).strip() == "1,2"


def test_a_job_waits_queued_for_gpus_and_says_who_holds_them(jw: Jobwarden, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    fake_gpus(nvml, {i: [os.getpid()] for i in range(4)})  # every GPU busy
    jw.env["JOBWARDEN_FAKE_NVML"] = str(nvml)
    fifo = make_fifo(tmp_path / "started")
    job = jw.start("sh", "-c", f"echo $CUDA_VISIBLE_DEVICES > {fifo}", options=("--gpu-ids", "3"))
    assert job["state"] == "queued" and job["pid"] is None
    status = jw.status(job["id"])
    assert status["state"] == "queued"
    assert f"pid {os.getpid()}" in status["queued_reason"]
    stray = next(f for f in status["findings"] if f["rule"] == "stray-gpu-process")  # preflight
    assert os.getpid() in stray["pids"]
    fake_gpus(nvml, {i: [os.getpid()] for i in range(3)})  # GPU 3 is freed
    assert read_fifo(fifo).strip() == "3"
    assert jw("wait", str(job["id"])).returncode == 0


def test_two_jobs_never_claim_the_same_gpu(jw: Jobwarden, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    fake_gpus(nvml, {})
    jw.env["JOBWARDEN_FAKE_NVML"] = str(nvml)
    fifos = [make_fifo(tmp_path / f"go{i}") for i in range(2)]
    first, second = (
        jw.start("sh", "-c", f"echo $CUDA_VISIBLE_DEVICES; read x < {f}", options=("--gpus", "3"))
        for f in fifos
    )
    assert (first["state"], second["state"]) == ("running", "queued")  # 4 GPUs, 3 each: one fits
    write_fifo(fifos[0])
    jw("wait", str(first["id"]), check=True)
    write_fifo(fifos[1])  # blocks until the second job has been admitted and opened its FIFO
    jw("wait", str(second["id"]), check=True)
    assert jw.output(first["id"]).strip() == jw.output(second["id"]).strip() == "0,1,2"


def test_gpu_memory_held_while_the_gpu_idles_is_named_gpu_idle(jw: Jobwarden, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    fake_gpus(nvml, {})
    jw.env["JOBWARDEN_FAKE_NVML"] = str(nvml)
    # a leftover loop: it holds 5 GiB on GPU 0 at 0% utilisation and keeps a CPU busy (so it is not "hung")
    code = (
        "import os, time\n"
        "from jobwarden.probes import fakenvml\n"
        f"fakenvml.hold({str(nvml)!r}, 0, os.getpid(), 5 << 30)\n"
        "end = time.monotonic() + 120\n"
        "while time.monotonic() < end:\n"
        "    pass\n"
    )
    job = jw.start(PY, "-c", code, options=("--hang-timeout", "2s", "--grace", "1s"))
    eventually(
        "a gpu-idle finding",
        lambda: "gpu-idle" in [f["rule"] for f in jw.status(job["id"])["findings"]],
        60,
        every_s=0.2,
    )
    status = jw.status(job["id"])
    finding = next(f for f in status["findings"] if f["rule"] == "gpu-idle")
    assert "GPU 0" in "\n".join(finding["evidence"]) or "GPU 0" in finding["summary"]
    assert [p["gpu_memory_bytes"] for p in status["processes"]] == [5 << 30]  # per process, in status
    jw("stop", str(job["id"]), check=True)


def test_on_hang_restart_restarts_a_hung_run_after_its_stacks_are_stored(jw: Jobwarden) -> None:
    code = (
        "import os, threading\n"
        "if os.environ['JOBWARDEN_RUN'] == '1':\n"
        "    threading.Event().wait()  # hangs on the first attempt only\n"
        "print('attempt', os.environ['JOBWARDEN_RUN'], 'done', flush=True)\n"
    )
    opts = ("--hang-timeout", "2s", "--on-hang", "restart", "--restart-delay", "0.1s", "--grace", "1s")
    result = jw("run", *opts, "--wait", "--", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    job = result.stdout.split()[0]
    first, second = runs_of(jw, job)
    assert (first["state"], first["end_reason"]) == ("failed", "hung")
    assert first["findings"][0]["rule"] == "no-progress"
    assert second["state"] == "succeeded"
    assert jw.output(job, 2) == "attempt 2 done\n"


def test_a_queued_job_can_be_stopped_before_it_starts(jw: Jobwarden, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    fake_gpus(nvml, {i: [os.getpid()] for i in range(4)})  # every GPU busy: it waits
    jw.env["JOBWARDEN_FAKE_NVML"] = str(nvml)
    job = jw.start("sh", "-c", "echo never", options=("--gpus", "1"))
    assert job["state"] == "queued"
    jw("stop", str(job["id"]), check=True)
    status = jw.status(job["id"])
    assert (status["state"], status["pid"], status["queued_reason"]) == ("stopped", None, None)
    logs = jw("logs", str(job["id"]))
    assert (logs.returncode, logs.stdout) == (0, "")  # it never ran: no output, and no error either

"""Attached mode without a cluster (`--engine ray` forces it): the CLI is the engine's task. Its SIGTERM is
an engine stop recorded as such, with the job's status as the CLI's exit code and the job's output on its
stdout; its death (SIGKILL, as Ray kills an actor) stops the job through the shim's parent-death signal,
so nothing is left running. The same on a real Slurm: tests/integration/slurm."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, make_fifo, read_fifo, start_time, wait_pid_gone

pytestmark = pytest.mark.integration

JOB = """
import signal, sys, time
def term(*_):
    print("stopping", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
signal.signal(signal.SIGUSR2, lambda *_: print("got SIGUSR2", flush=True))
print("started", flush=True)
with open(sys.argv[1], "w") as fifo:  # closed here, not by a finalizer, where an exit would be lost
    fifo.write("ready\\n")
while True:
    time.sleep(0.05)
"""


def _attached(jw: Jobwarden, fifo: Path, job: str = JOB) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        "jobwarden",
        "run",
        "--engine",
        "ray",
        "--",
        "python3",
        "-c",
        job,
        str(fifo),
    ]
    return subprocess.Popen(
        argv, env=jw.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_sigterm_at_the_cli_is_an_engine_stop_and_its_status_the_jobs(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "ready")
    cli = _attached(jw, fifo)
    try:
        assert read_fifo(fifo) == "ready\n"
        cli.send_signal(signal.SIGUSR2)  # forwarded: the job runs on
        cli.send_signal(signal.SIGTERM)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 143, err
    assert out.startswith("started\n") and out.endswith("stopping\n")
    (job,) = jw.json("ps", "--all")
    status = jw.status(job["id"])
    assert (status["state"], status["end_reason"]) == ("stopped", "engine-stop")
    assert [f["rule"] for f in jw.json("explain", str(job["id"]))["findings"]] == ["cancelled-by-engine"]


def test_an_engine_stop_keeps_the_stacks_of_a_job_that_prints_steadily(jw: Jobwarden, tmp_path: Path) -> None:
    # "where was it when the time limit hit?": a busy job, not only a quiet one, gets its stacks stored
    from jobwarden.store import Store

    fifo = make_fifo(tmp_path / "ready")
    cli = _attached(jw, fifo, JOB.replace("time.sleep(0.05)", "print('step', flush=True); time.sleep(0.05)"))
    try:
        assert read_fifo(fifo) == "ready\n"
        cli.send_signal(signal.SIGTERM)
        cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    (job,) = jw.json("ps", "--all")
    with Store(jw.home) as store:
        dumps = [d for d in store.stacks(job["id"], 1) if d.trigger == "engine-stop"]
    assert dumps and any(s.threads for s in dumps[0].stacks), dumps
    (finding,) = jw.json("explain", str(job["id"]))["findings"]
    assert f"`jobwarden dump {job['id']}` shows them" in "\n".join(finding["evidence"])


def test_the_clis_death_stops_the_job_through_the_shim(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "ready")
    cli = _attached(jw, fifo)
    try:
        assert read_fifo(fifo) == "ready\n"
        (job,) = jw.json("ps")
        shim = jw.status(job["id"])["shim_pid"]
        cli.kill()  # no relay: the shim's parent-death signal is the engine stop
        cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    wait_pid_gone(shim)  # reparented to init (or a subreaper), which reaps it; pidfd-based wait
    status = jw.status(job["id"])
    assert (status["state"], status["end_reason"]) == ("stopped", "engine-stop")
    assert start_time(job["pid"]) is None  # the job is gone with it


def test_json_is_refused_where_stdout_carries_the_jobs_output(jw: Jobwarden) -> None:
    result = jw("run", "--json", "--engine", "ray", "--", "true", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("jobwarden: run --json inside ray:"), result.stderr
    assert jw.json("ps", "--all") == []  # refused before anything was recorded

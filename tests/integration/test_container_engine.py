"""The container engine on the host (`--engine container`), and `jobwarden health` against real shims: what
needs no container runtime. The real containers are in tests/integration/containers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobwarden.store import Store
from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo
from tests.support import eventually

pytestmark = pytest.mark.integration


def _wait_for_event(jw: Jobwarden, job_id: int, kind: str, timeout_s: float = 60) -> None:
    def recorded() -> bool:
        with Store(jw.home) as store:
            return any(e.kind == kind for e in store.events(job_id, 1))

    eventually(f"a {kind} event of job {job_id}", recorded, timeout_s, every_s=0.1)


def test_engine_container_is_attached_and_tells_the_end(jw: Jobwarden, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    done = jw(
        "run", "--engine", "container", "--termination-log", str(log), "--", "sh", "-c", "echo out; exit 3"
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "out\n"
    text = log.read_text()
    assert text.startswith("jobwarden: job 1 (sh) failed: exit code 3") and "[exit-code]" in text
    assert (
        done.stderr.splitlines()[-len(text.splitlines()) :] == text.splitlines()
    )  # the same, last on stderr
    assert log.stat().st_mode & 0o777 == 0o600


def test_termination_log_needs_an_attached_run(jw: Jobwarden, tmp_path: Path) -> None:
    done = jw("run", "--engine", "none", "--termination-log", str(tmp_path / "log"), "--", "true")
    assert done.returncode == 2
    assert done.stderr.startswith("jobwarden: --termination-log: only an attached run")
    assert "Traceback" not in done.stderr and not (jw.home / "jobwarden.db").exists()


def test_health_of_real_runs(jw: Jobwarden, tmp_path: Path) -> None:
    """ok while a job shows progress, hung once the watchdog judged it (its hang event), ok again when it
    moves, failed once it failed, no-job (2) for a job that does not exist."""
    assert jw("health").returncode == 2  # no job at all: nothing created either
    assert not jw.home.exists()
    for name in ("ready", "hush", "wake"):
        make_fifo(tmp_path / name)
    script = tmp_path / "talker.py"
    source = Path(__file__).parent / "containers" / "jobs" / "talker.py"
    script.write_text(source.read_text().replace('"/t/', f'"{tmp_path}/'))
    job = jw.start("python3", str(script), options=("--hang-timeout", "2s", "--grace", "1s"))
    read_fifo(tmp_path / "ready")
    assert jw("health").returncode == 0
    write_fifo(tmp_path / "hush")
    _wait_for_event(jw, job["id"], "hung")
    hung = jw("health", "--json")
    assert hung.returncode == 1, hung.stdout
    assert json.loads(hung.stdout)["status"] == "hung"
    assert jw("health", str(job["id"])).returncode == 1
    assert jw("health", "no-such-job").returncode == 2
    write_fifo(tmp_path / "wake")
    # output again: the hang is over
    eventually("healthy again after the job moved", lambda: jw("health").returncode == 0, 30, every_s=0)
    jw("stop", str(job["id"]), check=True)
    failed = jw("run", "--wait", "--", "sh", "-c", "exit 4")
    assert failed.returncode == 4
    verdict = jw("health")  # the newest job
    assert (verdict.returncode, verdict.stdout.strip()) == (1, "failed: job 2: failed (exit code 4)")

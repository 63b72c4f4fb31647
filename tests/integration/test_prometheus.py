"""/metrics and `metrics --prometheus` over real jobs: the output parses with prometheus_client into typed
families (never `unknown`), passes `promtool check metrics`, carries no label Prometheus would rename or
that would leak a process's identity, and holds the jobs' real values."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwarden.control.prometheus import exposition
from jobwarden.model import Finding
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store
from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration
TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")
FORBIDDEN_LABELS = {"job", "instance", "pid", "cmdline", "command", "cwd", "env"}


def families(text: str) -> dict[str, object]:
    """Family name -> family, checking what every exposition must satisfy."""
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    for family in parsed.values():
        assert family.type in ("gauge", "counter"), (family.name, family.type)
        assert family.name.startswith("jobwarden_"), family.name
        for sample in family.samples:
            assert not FORBIDDEN_LABELS & set(sample.labels), sample
            assert sample.timestamp is None, sample
            if family.name != "jobwarden_job_info":
                assert "job_name" not in sample.labels, sample
    return parsed


def value(parsed: dict[str, object], name: str, **labels: str) -> float | None:
    family = parsed[name.removesuffix("_total")]
    found = [s.value for s in family.samples if s.labels == labels]  # type: ignore[attr-defined]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        why = "promtool (Debian package prometheus) is not installed; scripts/test installs it as root"
        unavailable(why)
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def live_job(jw: Jobwarden, tmp_path: Path) -> Iterator[dict[str, object]]:
    """A running job that waits on a FIFO, with its first sample recorded; ended on the way out."""
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1", options=("--name", 'live "one"\\'))
    read_fifo(ready)
    with Store(jw.home) as store:
        eventually(
            "a sample of the live job",
            lambda: store.latest_sample(int(job["id"]), 1) is not None,  # type: ignore[call-overload]
            60,
            every_s=0.05,
        )
    yield job
    write_fifo(go, "0 0\n")
    jw("wait", str(job["id"]), check=True)


def test_metrics_of_a_live_and_a_failed_job(jw: Jobwarden, live_job: dict[str, object]) -> None:
    failed = jw("run", "--name", "failed", "--wait", "--", "sh", "-c", "echo oops; exit 3")
    assert failed.returncode == 3
    live_id, failed_id = str(live_job["id"]), failed.stdout.split()[0]
    with Store(jw.home) as store:
        store.add_finding(int(failed_id), 1, time.time(), Finding("exit-code", "t", "s", "error"))
        text = exposition(store, ProcFS(), time.time())
        failed_run = store.run(int(failed_id))
    parsed = families(text)
    promtool_check(text)

    assert value(parsed, "jobwarden_job_info", job_id=live_id, job_name='live "one"\\') == 1
    assert value(parsed, "jobwarden_job_info", job_id=failed_id, job_name="failed") == 1
    assert value(parsed, "jobwarden_job_state", job_id=live_id, state="running") == 1
    assert value(parsed, "jobwarden_job_state", job_id=live_id, state="failed") == 0
    assert value(parsed, "jobwarden_job_state", job_id=failed_id, state="failed") == 1
    assert value(parsed, "jobwarden_job_run", job_id=failed_id) == 1
    assert value(parsed, "jobwarden_job_restarts_total", job_id=live_id) == 0
    assert value(parsed, "jobwarden_job_start_time_seconds", job_id=failed_id) == failed_run.started_at
    assert value(parsed, "jobwarden_job_end_time_seconds", job_id=failed_id) == failed_run.ended_at
    assert value(parsed, "jobwarden_job_end_time_seconds", job_id=live_id) is None
    assert value(parsed, "jobwarden_job_processes", job_id=live_id) == 1
    assert (value(parsed, "jobwarden_job_memory_rss_bytes", job_id=live_id) or 0) > 1 << 20
    assert (value(parsed, "jobwarden_job_memory_peak_bytes", job_id=live_id) or 0) > 1 << 20
    assert value(parsed, "jobwarden_job_processes", job_id=failed_id) is None  # nothing of it is alive
    progress = value(parsed, "jobwarden_job_last_progress_timestamp_seconds", job_id=failed_id)
    assert progress is not None and abs(progress - (failed_run.ended_at or 0)) < 5
    assert value(parsed, "jobwarden_job_findings", job_id=failed_id, rule="exit-code") == 1
    assert value(parsed, "jobwarden_findings_total", rule="exit-code") == 1
    assert value(parsed, "jobwarden_runs_ended_total", state="failed") == 1
    assert value(parsed, "jobwarden_store_up") == 1
    assert 0 < (value(parsed, "jobwarden_scrape_duration_seconds") or 0) < 5


def test_metrics_prometheus_prints_one_job(jw: Jobwarden, live_job: dict[str, object]) -> None:
    jw("run", "--name", "other", "--wait", "--", "true", check=True)
    result = jw("metrics", str(live_job["id"]), "--prometheus")
    assert result.returncode == 0, result.stderr
    parsed = families(result.stdout)
    promtool_check(result.stdout)
    job_ids = {s.labels.get("job_id") for f in parsed.values() for s in f.samples}  # type: ignore[attr-defined]
    assert job_ids == {str(live_job["id"])}
    assert value(parsed, "jobwarden_job_state", job_id=str(live_job["id"]), state="running") == 1

"""A worker that dies milliseconds after it was born is still named, with its exit status, every time: by
the kernel's process events, by the Python hooks (the child's own announcement, its parent's reaping), or
both. Its parent then gives up with exit code 1; `explain` must blame the worker, not the parent."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Jobwarden, require_kernel_process_events

pytestmark = pytest.mark.integration
JOB = Path(__file__).resolve().parent / "jobs" / "early_death.py"
DELAYS_MS = (0, 1, 2, 5, 10)


@pytest.fixture(scope="module")
def kernel_events() -> None:
    require_kernel_process_events()


def worker_of(jw: Jobwarden, job: int) -> int:
    line = next(line for line in jw.output(job).splitlines() if line.startswith("worker "))
    return int(line.split()[1])


def run_and_explain(jw: Jobwarden, how: str, delay_ms: int, options: tuple[str, ...]) -> dict[str, Any]:
    ran = jw("run", "--json", "--wait", *options, "--", sys.executable, str(JOB), how, str(delay_ms))
    assert ran.returncode == 1, ran.stderr  # the parent gave up: --wait passes its exit code on
    job = json.loads(ran.stdout)
    report = dict(jw.json("explain", str(job["id"])))
    report["worker"] = worker_of(jw, job["id"])
    return report


def assert_worker_named(report: dict[str, Any]) -> None:
    first = report["findings"][0]
    assert first["rule"] == "killed-externally", report["findings"]
    assert first["pids"][0] == report["worker"], first
    assert "SIGKILL" in first["summary"]
    assert all(f["rule"] != "exit-code" for f in report["findings"])  # the parent's exit 1 is only its report


@pytest.mark.usefixtures("kernel_events")
@pytest.mark.parametrize("how", ["fork", "spawn", "exec"])
def test_a_worker_killed_0_to_10_ms_after_birth_is_named_20_times_out_of_20(jw: Jobwarden, how: str) -> None:
    for delay in DELAYS_MS * 4:
        assert_worker_named(run_and_explain(jw, how, delay, ()))


@pytest.mark.parametrize("how", ["fork", "spawn", "exec"])
def test_the_python_hooks_alone_name_it(jw: Jobwarden, how: str) -> None:
    # where the kernel refuses its events (a container): the child's announcement, its parent's reaping
    jw.env["JOBWARDEN_PROC_EVENTS"] = "off"
    for delay in DELAYS_MS:
        assert_worker_named(run_and_explain(jw, how, delay, ()))


@pytest.mark.usefixtures("kernel_events")
@pytest.mark.parametrize("how", ["fork", "exec"])
def test_the_kernels_events_alone_name_it(jw: Jobwarden, how: str) -> None:
    for delay in DELAYS_MS:
        assert_worker_named(run_and_explain(jw, how, delay, ("--no-py-hooks",)))

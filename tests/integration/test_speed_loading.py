"""The data-loading speed rules on real PyTorch (CPU) training loops (tests/integration/jobs/loader_job.py):
a CPU-heavy Dataset.__getitem__ with num_workers=0 is data-loading-in-main (the job started through `sh
-c`: the loop is not the main process); a DataLoader that keeps up is
neither, and the same job whose worker turns slow while its model turns fast is input-bound. The shim
samples the main thread's stack every 2 s here (JOBWARDEN_SPEED_STACK_EVERY_S) to decide within a minute.

Handshakes: the job says "ready" after its first batch; the switch to a slow worker is a file the test
creates; findings are polled for with deadlines. Jobs are stopped by `jobwarden stop`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobwarden.probes.pyspy import find_py_spy
from tests.conftest import Jobwarden
from tests.integration.test_speed import PY, explained, finding, ready, speed_findings, stop
from tests.support import eventually, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
JOB = Path(__file__).resolve().parent / "jobs" / "loader_job.py"
LOADING = {"input-bound", "data-loading-in-main"}
QUIET_S = 30.0  # a DataLoader that keeps up is watched this long (about 15 samples) for a wrong finding


@pytest.fixture(autouse=True)
def needs_torch_and_py_spy(jw: Jobwarden) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        unavailable("needs torch")
    if find_py_spy() is None:
        unavailable("needs py-spy")
    jw.env["JOBWARDEN_SPEED_STACK_EVERY_S"] = "2"


def test_a_heavy_getitem_without_workers_is_data_loading_in_main(jw: Jobwarden) -> None:
    # started through a wrapper, as a script or `uv run` does: the job's main process is a shell with no
    # torch (a command after the loop keeps dash from exec'ing python in its place); the loop is below it
    job = jw.start("sh", "-c", f'"{PY}" "{JOB}" main; echo "loop ended: $?"')["id"]
    try:
        ready(jw, job)
        f = eventually("data-loading-in-main", lambda: finding(jw, job, "data-loading-in-main"), 120)
        assert (
            f["title"].startswith("data loading runs in the main process ") and "num_workers=0" in f["title"]
        )
        assert "most often in Burning.__getitem__" in f["evidence"][0], f["evidence"]
        # the finding names the loop's process, not the shell above it
        (loop,) = f["pids"]
        assert loop != jw.status(job)["pid"] and str(JOB) in Path(f"/proc/{loop}/cmdline").read_text()
        assert "num_workers=1" in f["remedy"]
        assert finding(jw, job, "input-bound") is None
        explained(jw, job, "data-loading-in-main")
    finally:
        stop(jw, job)


def test_a_dataloader_that_keeps_up_is_neither_until_its_worker_falls_behind(
    jw: Jobwarden, tmp_path: Path
) -> None:
    slower = tmp_path / "slow-worker"
    job = jw.start(PY, str(JOB), "keepsup", str(slower))["id"]
    try:
        ready(jw, job)
        quiet_until = time.monotonic() + QUIET_S
        while time.monotonic() < quiet_until:
            wrong = {f["rule"] for f in speed_findings(jw, job)} & LOADING
            assert not wrong, f"a DataLoader that keeps up was judged {wrong}"
            time.sleep(1)
        slower.touch()  # the worker's __getitem__ turns heavy, the model step trivial
        f = eventually("input-bound", lambda: finding(jw, job, "input-bound"), 120)
        assert f["title"].startswith("the loop waits on its DataLoader "), f["title"]
        assert "pt_data_worker" in f["evidence"][1] and "pin_memory" in f["remedy"]
        assert finding(jw, job, "data-loading-in-main") is None
        explained(jw, job, "input-bound")
    finally:
        stop(jw, job)

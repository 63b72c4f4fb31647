"""`jobwarden metrics` and the sparklines of `status` on a real job: the shim fills CPU seconds, storage
bytes and memory from /proc, and the commands read them back."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.probes import fakenvml
from tests.conftest import Jobwarden, processes_under
from tests.support import eventually

pytestmark = pytest.mark.integration
MIB = 1 << 20

# Writes 8 MiB to a file first (a later sample sees the bytes), then burns 2 s of CPU time, holding
# 64 MiB meanwhile, so that a few samples are taken however loaded the machine is.
BUSY_JOB = """
import os, time
with open("data.bin", "wb") as fh:
    fh.write(os.urandom(8 << 20))
ballast = bytearray(64 << 20)
while time.process_time() < 2.0:
    sum(i * i for i in range(10000))
"""


@pytest.fixture(scope="module")
def ended_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Jobwarden, str]]:
    tmp = tmp_path_factory.mktemp("metrics")
    jw = Jobwarden(tmp / "home", tmp)
    done = jw("run", "--wait", "--name", "busy", "--cwd", str(tmp), "--", sys.executable, "-c", BUSY_JOB)
    assert done.returncode == 0, done.stderr
    yield jw, done.stdout.split()[0]
    assert processes_under(jw.home) == []  # --wait returned after the shim's end: nothing left


def test_metrics_json_has_io_cpu_time_and_memory(ended_job: tuple[Jobwarden, str]) -> None:
    jw, job = ended_job
    samples = jw.json("metrics", job)
    assert len(samples) >= 2
    keys = {"at", "cpu_percent", "rss_bytes", "nprocs", "io_read_bytes", "io_write_bytes", "gpu_util"}
    assert all(keys | {"gpu_memory_bytes", "t"} <= set(s) for s in samples)
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    assert max(s["io_write_bytes"] or 0 for s in samples) >= 8 * MIB
    assert max(s["cpu_time_s"] or 0 for s in samples) >= 1.0
    assert max(s["rss_bytes"] for s in samples) >= 64 * MIB
    assert all(s["gpu_util"] is None for s in samples)  # no GPU: unknown, not 0


def test_metrics_text_draws_a_sparkline_per_metric(ended_job: tuple[Jobwarden, str]) -> None:
    jw, job = ended_job
    jw.env["COLUMNS"] = "100"
    shown = jw("metrics", job, check=True).stdout
    lines = {line.split()[0]: line for line in shown.splitlines()[1:] if line.strip()}
    assert {"CPU", "RSS", "processes", "I/O"} <= set(lines)
    assert any(block in lines["CPU"] for block in "▁▂▃▄▅▆▇█")
    assert "max" in lines["RSS"] and "M" in lines["RSS"]
    assert all(len(line) <= 100 for line in shown.splitlines()[1:])
    assert "\033[" not in shown  # NO_COLOR (and not a terminal)


def test_status_shows_the_last_minutes_as_sparklines(ended_job: tuple[Jobwarden, str]) -> None:
    jw, job = ended_job
    shown = jw("status", job, check=True).stdout
    assert "last" in shown
    cpu = [line for line in shown.splitlines() if line.strip().startswith("CPU")]
    assert cpu and any(block in cpu[0] for block in "▁▂▃▄▅▆▇█")


def test_metrics_since_of_a_bad_duration_names_the_option(ended_job: tuple[Jobwarden, str]) -> None:
    jw, job = ended_job
    bad = jw("metrics", job, "--since", "ten minutes")
    assert bad.returncode == 2
    assert "--since" in bad.stderr and "ten minutes" in bad.stderr
    assert "Traceback" not in bad.stderr
    recent = jw.json("metrics", job, "--since", "1h")
    assert recent and len(recent) <= len(jw.json("metrics", job))


# Takes memory on two fake GPUs, then waits for the test's word (a file appearing).
GPU_JOB = """
import os, sys, time
from jobwarden.probes import fakenvml
state = os.environ[fakenvml.FAKE_NVML_ENV]
fakenvml.hold(state, 0, os.getpid(), 2 << 30)
fakenvml.hold(state, 1, os.getpid(), 1 << 30)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def test_gpu_use_per_gpu_reaches_metrics_through_the_shim(jw: Jobwarden, tmp_path: Path) -> None:
    state, done = tmp_path / "nvml.json", tmp_path / "done"
    fakenvml.write_state(state, {"devices": [fakenvml.device(i, utilization=60 + 20 * i) for i in range(3)]})
    jw.env[fakenvml.FAKE_NVML_ENV] = str(state)
    job = str(jw.start(sys.executable, "-c", GPU_JOB, str(done))["id"])
    try:
        eventually(
            "the job's GPUs sampled",
            lambda: any(len(s["gpus"]) == 2 for s in jw.json("metrics", job)),
            90,
            every_s=0.5,
        )
    finally:
        done.touch()
    assert jw("wait", job).returncode == 0
    seen = [s for s in jw.json("metrics", job) if s["gpus"]]
    assert seen[-1]["gpus"] == [
        {"index": 0, "util": 60.0, "memory_bytes": 2 << 30},
        {"index": 1, "util": 80.0, "memory_bytes": 1 << 30},
    ]
    assert (seen[-1]["gpu_util"], seen[-1]["gpu_memory_bytes"]) == (70.0, 3 << 30)
    jw.env["COLUMNS"] = "120"
    shown = jw("metrics", job, check=True).stdout
    assert "GPU 0 util" in shown and "GPU 1 mem" in shown and "3.0G" in shown

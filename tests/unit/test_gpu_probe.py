"""The GPU probe over the fake NVML: what it reads, how NVML's failures reach (or never reach) the caller,
how it is opened, and one job's share of a reading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobwarden.observations import GpuDevice, GpuProcess
from jobwarden.probes import fakenvml, gpu
from jobwarden.probes.gpu import (
    GpuProbe,
    GpuProbeError,
    GpuUnavailable,
    job_gpu_usage,
    open_gpu_probe,
    try_open_gpu_probe,
)

GIB = 1 << 30


def gpu_unavailable_reason(environ: dict[str, str]) -> GpuUnavailable | None:
    """Why `open_gpu_probe` returns None here, or None when it works (the probe is closed again)."""
    probe = try_open_gpu_probe(environ)
    if isinstance(probe, GpuProbe):
        probe.close()
        return None
    return probe


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "nvml.json"
    gpus = [fakenvml.device(i, memory_total=80 * GIB, name="NVIDIA H100 80GB HBM3") for i in range(2)]
    fakenvml.write_state(path, {"devices": gpus})
    return path


@pytest.fixture
def probe(state: Path) -> Any:
    opened = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert opened is not None
    yield opened
    opened.close()


def change_gpu(path: Path, index: int, **fields: object) -> None:
    fakenvml.update_state(path, lambda s: s["devices"][index].update(fields))


def test_devices_are_read_with_memory_utilisation_and_names(probe: GpuProbe, state: Path) -> None:
    change_gpu(state, 1, memory_used=3 * GIB, utilization={"gpu": 87, "memory": 40})
    assert probe.devices() == [
        GpuDevice(0, "GPU-fake-0000", "NVIDIA H100 80GB HBM3", 80 * GIB, 0, 0.0),
        GpuDevice(1, "GPU-fake-0001", "NVIDIA H100 80GB HBM3", 80 * GIB, 3 * GIB, 87.0),
    ]
    assert probe.device_errors == {}
    assert probe.source == f"fake:{state}"


def test_processes_merge_both_lists_and_keep_unknown_memory(probe: GpuProbe, state: Path) -> None:
    fakenvml.hold(state, 0, 4242, 5 * GIB)
    fakenvml.hold(state, 0, 4242, 5 * GIB, kind="graphics")  # CUDA/graphics interop: in both lists
    fakenvml.hold(state, 0, 77, 200 << 20, kind="graphics")  # a desktop's Xorg
    fakenvml.hold(state, 1, 4242, None)  # NVML could not tell (WDDM, some containers)
    assert probe.processes() == [
        GpuProcess(0, 77, 200 << 20, "graphics"),
        GpuProcess(0, 4242, 5 * GIB, "compute+graphics"),
        GpuProcess(1, 4242, None, "compute"),
    ]
    # the device's used memory counts each process once
    assert probe.devices()[0].memory_used_bytes == 5 * GIB + (200 << 20)


def test_the_state_is_read_again_on_every_call(probe: GpuProbe, state: Path) -> None:
    assert probe.processes() == []
    fakenvml.hold(state, 1, 999, GIB)
    assert [p.pid for p in probe.processes()] == [999]
    fakenvml.release(state, 999)
    assert probe.processes() == []


@pytest.mark.parametrize(
    ("error", "shown"),
    [("GpuIsLost", "GPU is lost"), ("NoPermission", "No permission"), ("ResetRequired", "Reset required")],
)
def test_one_failing_gpu_is_left_out_and_named(probe: GpuProbe, state: Path, error: str, shown: str) -> None:
    fakenvml.hold(state, 0, 10, GIB)
    fakenvml.hold(state, 1, 11, GIB)
    change_gpu(state, 0, error=error)
    assert [d.index for d in probe.devices()] == [1]
    assert probe.device_errors == {0: shown}
    assert [p.pid for p in probe.processes()] == [11]
    change_gpu(state, 0, error=None)
    assert len(probe.devices()) == 2 and probe.device_errors == {}


def test_unsupported_utilisation_and_process_lists(probe: GpuProbe, state: Path) -> None:
    change_gpu(state, 0, utilization=None, graphics=None)  # NOT_SUPPORTED, as on some boards
    fakenvml.hold(state, 0, 5, GIB)
    assert probe.devices()[0].utilization_percent is None
    assert probe.processes() == [GpuProcess(0, 5, GIB, "compute")]


def test_a_driver_reload_raises_one_error_type_then_recovers(probe: GpuProbe, state: Path) -> None:
    fakenvml.update_state(state, lambda s: s.update(error="DriverNotLoaded"))
    with pytest.raises(GpuProbeError) as info:
        probe.devices()
    assert "cannot read the GPUs: Driver not loaded" in str(info.value)
    assert "nvidia-smi" in info.value.remedy
    with pytest.raises(GpuProbeError):
        probe.processes()
    fakenvml.update_state(state, lambda s: s.update(error=None))
    assert len(probe.devices()) == 2  # NVML initialised again by itself


def test_an_uninitialised_library_is_initialised_again(state: Path) -> None:
    nvml = fakenvml.FakeNvml(state)
    nvml.nvmlInit()
    probe = GpuProbe(nvml, "test")
    nvml.nvmlShutdown()  # what a driver reload does to the session underneath us
    with pytest.raises(GpuProbeError, match="Uninitialized"):
        probe.devices()
    assert len(probe.devices()) == 2
    probe.close()


class _BrokenBinding:
    """A binding out of step with the driver: it fails with something other than NVMLError."""

    NVMLError = fakenvml.NVMLError
    shutdowns = 0

    def nvmlDeviceGetCount(self) -> int:
        raise AttributeError("function nvmlDeviceGetCount_v2 not found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def test_any_other_failure_of_the_binding_is_a_probe_error() -> None:
    binding = _BrokenBinding()
    probe = GpuProbe(binding, "test")
    with pytest.raises(GpuProbeError, match="AttributeError"):
        probe.devices()
    probe.close()
    assert binding.shutdowns == 0  # NVML is in an unknown state: leave it alone


class _CountingNvml(fakenvml.FakeNvml):
    shutdowns = 0

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        super().nvmlShutdown()


def test_close_shuts_nvml_down_once_and_the_probe_refuses_reads(state: Path) -> None:
    nvml = _CountingNvml(state)
    nvml.nvmlInit()
    with GpuProbe(nvml, "test") as probe:
        assert len(probe.devices()) == 2
    probe.close()
    assert nvml.shutdowns == 1
    with pytest.raises(GpuProbeError, match="closed"):
        probe.devices()


# --- opening ---------------------------------------------------------------------------------------


def test_no_driver_gives_no_probe_and_a_reason(tmp_path: Path) -> None:
    env = {fakenvml.FAKE_NVML_ENV: str(tmp_path / "absent.json")}
    assert open_gpu_probe(env) is None
    reason = gpu_unavailable_reason(env)
    assert reason is not None
    assert "Driver not loaded" in reason.reason and "nvidia-smi" in reason.remedy


def test_no_permission_at_init_names_the_device_files(state: Path) -> None:
    fakenvml.update_state(state, lambda s: s.update(init_error="NoPermission"))
    reason = try_open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert isinstance(reason, GpuUnavailable)
    assert "/dev/nvidia" in reason.remedy


def test_a_working_probe_has_no_unavailable_reason(state: Path) -> None:
    assert gpu_unavailable_reason({fakenvml.FAKE_NVML_ENV: str(state)}) is None


def test_without_the_binding_the_reason_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    monkeypatch.setattr(gpu, "DRIVER_FILES", (str(tmp_path),))  # a machine with the driver's files
    reason = gpu_unavailable_reason({})
    assert reason is not None
    assert "pynvml" in reason.reason and "jobwarden[gpu]" in reason.remedy


def test_without_a_driver_the_reason_is_that_there_are_no_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not "install pynvml": nothing installed would make GPUs appear (issue 21)."""
    monkeypatch.setattr(gpu, "DRIVER_FILES", (str(tmp_path / "nvidiactl"),))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    reason = gpu_unavailable_reason({})
    assert reason is not None
    assert reason.reason.startswith("this machine has no GPUs") and "pynvml" not in str(reason)


def test_the_real_binding_without_a_driver_says_there_are_no_gpus() -> None:
    pytest.importorskip("pynvml")
    if gpu.nvidia_driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    reason = gpu_unavailable_reason({})
    assert reason is not None
    assert reason.reason.startswith("this machine has no GPUs") and "--gpus" in reason.remedy


def test_pynvml_is_imported_only_when_a_probe_is_opened(state: Path) -> None:
    code = (
        "import sys, os\n"
        "import jobwarden.cli.main, jobwarden.control.launch\n"
        "import jobwarden.shim.admission.gpus, jobwarden.probes.gpu\n"
        "assert 'pynvml' not in sys.modules, 'imported at module level'\n"
        "from jobwarden.probes.gpu import open_gpu_probe\n"
        f"open_gpu_probe({{'JOBWARDEN_FAKE_NVML': {str(state)!r}}}).close()\n"
        "assert 'pynvml' not in sys.modules, 'imported for the fake'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- one job's share ---------------------------------------------------------------------------------


def test_job_gpu_usage_sums_per_pid_and_reports_the_gpus_it_uses() -> None:
    devices = [GpuDevice(i, f"GPU-{i}", "H100", 80 * GIB, 0, float(u)) for i, u in enumerate((0, 97, 50))]
    processes = [
        GpuProcess(0, 10, 2 * GIB),
        GpuProcess(1, 10, 3 * GIB),
        GpuProcess(1, 11, GIB),
        GpuProcess(2, 99, 7 * GIB),  # another job's
    ]
    usage = job_gpu_usage(devices, processes, {10, 11, 12})
    assert usage.bytes_by_pid == {10: 5 * GIB, 11: GIB}
    assert usage.total_bytes == 6 * GIB and usage.complete
    assert usage.gpus == (0, 1)
    assert usage.utilization == {0: 0.0, 1: 97.0}
    assert usage.max_utilization == 97.0


def test_job_gpu_usage_keeps_unknown_memory_unknown() -> None:
    devices = [GpuDevice(0, "GPU-0", "H100", 80 * GIB, 0, None)]
    usage = job_gpu_usage(devices, [GpuProcess(0, 10, None), GpuProcess(0, 11, GIB)], [10, 11])
    assert usage.bytes_by_pid == {10: None, 11: GIB}
    assert usage.total_bytes == GIB and not usage.complete
    assert usage.max_utilization is None


def test_job_gpu_usage_of_a_job_without_gpu_memory() -> None:
    usage = job_gpu_usage([GpuDevice(0, "GPU-0", "H100", 80 * GIB, GIB, 100.0)], [GpuProcess(0, 5, GIB)], [6])
    assert (usage.bytes_by_pid, usage.total_bytes, usage.gpus, usage.utilization) == ({}, 0, (), {})
    assert usage.complete and usage.max_utilization is None

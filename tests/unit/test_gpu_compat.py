"""The fake NVML and the real `pynvml` offer every call the probe makes, in the same shape.

The real module is checked without a GPU: importing pynvml loads no library (that happens in nvmlInit), so
its functions' signatures, error codes and result structures can be read on any machine. Where
nvidia-ml-py is not installed (`pip install 'jobwarden[gpu]'`) the checks of the real module are skipped.
"""

from __future__ import annotations

import inspect
import re
from types import ModuleType
from typing import Any

import pytest

from jobwarden.probes import fakenvml
from jobwarden.probes import gpu as gpu_module
from jobwarden.probes.gpu import NVML_CALLS, NVML_CONSTANTS


@pytest.fixture(scope="module")
def pynvml() -> ModuleType:
    return pytest.importorskip("pynvml")


@pytest.fixture(params=["pynvml", "fakenvml module", "FakeNvml"])
def binding(request: pytest.FixtureRequest) -> Any:
    if request.param == "pynvml":
        return pytest.importorskip("pynvml")
    return fakenvml if request.param == "fakenvml module" else fakenvml.FakeNvml("/nonexistent")


@pytest.mark.parametrize("name", sorted(NVML_CALLS))
def test_every_call_of_the_probe_exists_with_a_compatible_signature(binding: Any, name: str) -> None:
    fn = getattr(binding, name, None)
    assert callable(fn), f"no {name}"
    # the probe passes exactly NVML_CALLS[name] positional arguments
    inspect.signature(fn).bind(*[object()] * NVML_CALLS[name])


def test_the_probe_reads_only_what_it_declares() -> None:
    # every nvml.<function> the probe's source calls is in NVML_CALLS, so the checks above cover it
    source = inspect.getsource(gpu_module)
    called = set(re.findall(r"_nvml\.(nvml\w+)", source)) | set(re.findall(r"\bnvml\.(nvml\w+)", source))
    assert called and called <= set(NVML_CALLS)


def test_the_error_codes_the_probe_reads_agree(pynvml: ModuleType) -> None:
    for name in NVML_CONSTANTS:
        assert getattr(pynvml, name) == getattr(fakenvml, name) == getattr(fakenvml.FakeNvml(), name), name


def test_nvml_errors_are_built_from_a_code_the_same_way(pynvml: ModuleType) -> None:
    for nvml in (pynvml, fakenvml):
        err = nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST)
        assert isinstance(err, nvml.NVMLError) and isinstance(err, Exception)
        assert err.value == 15
        assert type(err).__name__ == "NVMLError_GpuIsLost"
        assert type(err) is nvml.NVMLError_GpuIsLost


def _fields(struct: Any) -> set[str]:
    return {field[0] for field in struct._fields_}


def test_the_result_structures_have_the_fields_the_probe_reads(pynvml: ModuleType) -> None:
    assert {"total", "used", "free"} <= _fields(pynvml.c_nvmlMemory_t)
    assert {"gpu", "memory"} <= _fields(pynvml.c_nvmlUtilization_t)
    process_structs = [getattr(pynvml, n) for n in dir(pynvml) if n.startswith("c_nvmlProcessInfo")]
    assert process_structs
    for struct in process_structs:
        assert {"pid", "usedGpuMemory"} <= _fields(struct), struct.__name__
    # the not-available marker pynvml turns into None, which the probe keeps as None
    assert pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value == 2**64 - 1


def test_the_fake_results_have_the_same_fields(tmp_path: Any) -> None:
    path = tmp_path / "nvml.json"
    fakenvml.write_state(path, {"devices": [fakenvml.device(0)]})
    fakenvml.hold(path, 0, 7, None)
    nvml = fakenvml.FakeNvml(path)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.total, memory.used, memory.free) == (80 << 30, 0, 80 << 30)
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    assert (rates.gpu, rates.memory) == (0, 0)
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (proc.pid, proc.usedGpuMemory) == (7, None)
    nvml.nvmlShutdown()


def test_the_fake_refuses_calls_before_init_as_nvml_does(tmp_path: Any) -> None:
    path = tmp_path / "nvml.json"
    fakenvml.write_state(path, {"devices": [fakenvml.device(0)]})
    nvml = fakenvml.FakeNvml(path)
    with pytest.raises(fakenvml.NVMLError) as info:
        nvml.nvmlDeviceGetCount()
    assert info.value.value == fakenvml.NVML_ERROR_UNINITIALIZED
    nvml.nvmlInit()
    with pytest.raises(fakenvml.NVMLError) as info:
        nvml.nvmlDeviceGetHandleByIndex(1)
    assert info.value.value == fakenvml.NVML_ERROR_INVALID_ARGUMENT


def test_the_module_functions_follow_the_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # `import jobwarden.probes.fakenvml as pynvml` works as a drop-in, reading $JOBWARDEN_FAKE_NVML
    path = tmp_path / "nvml.json"
    fakenvml.write_state(path, {"devices": [fakenvml.device(0), fakenvml.device(1)]})
    monkeypatch.setenv(fakenvml.FAKE_NVML_ENV, str(path))
    fakenvml.nvmlInit()
    try:
        assert fakenvml.nvmlDeviceGetCount() == 2
        handle = fakenvml.nvmlDeviceGetHandleByIndex(1)
        assert fakenvml.nvmlDeviceGetUUID(handle) == "GPU-fake-0001"
    finally:
        fakenvml.nvmlShutdown()

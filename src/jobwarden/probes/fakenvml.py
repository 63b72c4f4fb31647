"""A stand-in for `pynvml` (nvidia-ml-py) whose GPUs live in a JSON file: GPU code tested without a GPU.

With JOBWARDEN_FAKE_NVML=/path/state.json, `open_gpu_probe` uses `FakeNvml` in place of pynvml, so the
real probe code runs over it. Only the calls the probe makes exist, with pynvml's names, signatures and
result shapes (a test checks them against the real module). The file is re-read on every call, so a test
can change the GPUs while a job runs: a job "takes" a GPU by adding its own pid (`hold`).

The state file:

    {"devices": [{"uuid": "GPU-0", "name": "Fake GPU", "memory_total": 85899345920,
                  "memory_used": 0,            # optional; default: what the listed processes use
                  "utilization": {"gpu": 0, "memory": 0},   # null: NOT_SUPPORTED, as on some boards
                  "compute": [{"pid": 4242, "used": 5476083302}],   # "used": null = not available
                  "graphics": [],
                  "clocks": {"sm": 1410, "sm_max": 1980},   # MHz; absent: NOT_SUPPORTED
                  "clock_reasons": 0,          # NVML clock event reasons bitmask; absent: NOT_SUPPORTED
                  "process_utilization": [{"pid": 4242, "sm": 80, "mem": 30}],   # absent: NOT_SUPPORTED
                  "error": null}],             # e.g. "GpuIsLost": every call on this GPU fails
     "driver_version": "550.54.15",            # absent: NOT_SUPPORTED
     "cuda_driver_version": 12040,             # 12.4; absent: NOT_SUPPORTED
     "error": null,                            # e.g. "DriverNotLoaded": every call fails (driver reload)
     "init_error": null}                       # raised by nvmlInit only

A missing file reads as a machine without a driver (nvmlInit fails with DriverNotLoaded). Change the
file only through `update_state` (or `write_state`): an atomic rename under a lock, so a reader never sees
half a file and two writers never lose each other's change.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

FAKE_NVML_ENV = "JOBWARDEN_FAKE_NVML"

# NVML's return codes (nvml.h): stable across driver versions, the same numbers pynvml exposes
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

_ERROR_NAMES = {
    name.removeprefix("NVML_ERROR_"): value
    for name, value in dict(globals()).items()
    if name.startswith("NVML_ERROR_")
}


def _class_name(constant: str) -> str:
    """NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, the subclass names pynvml generates."""
    return "NVMLError_" + "".join(part.title() for part in constant.split("_"))


class NVMLError(Exception):
    """pynvml's error: `NVMLError(code)` builds the subclass for that code, `.value` is the code."""

    value: int
    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}  # filled once below, like pynvml's mapping

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        names = {v: k for k, v in _ERROR_NAMES.items()}
        text = names.get(self.value, f"NVML error {self.value}").replace("_", " ").capitalize()
        return text.replace("Gpu", "GPU")


for _name, _code in _ERROR_NAMES.items():
    _cls = type(_class_name(_name), (NVMLError,), {})
    NVMLError._by_code[_code] = _cls
    globals()[_cls.__name__] = _cls


def _error(spec: str | int) -> NVMLError:
    """'GpuIsLost', 'GPU_IS_LOST' or 15 -> the NVMLError for it."""
    if isinstance(spec, int):
        return NVMLError(spec)
    wanted = spec.replace("_", "").lower()
    for name, code in _ERROR_NAMES.items():
        if name.replace("_", "").lower() == wanted:
            return NVMLError(code)
    raise ValueError(f"fake NVML: unknown error {spec!r} (one of {sorted(_ERROR_NAMES)})")


# --- result shapes: what pynvml's ctypes structures offer to callers --------------------------------


@dataclass
class _Memory:  # c_nvmlMemory_t
    total: int
    free: int
    used: int


@dataclass
class _Utilization:  # c_nvmlUtilization_t
    gpu: int
    memory: int


@dataclass
class _ProcessInfo:  # nvmlFriendlyObject of c_nvmlProcessInfo_v3_t
    pid: int
    usedGpuMemory: int | None  # pynvml's name
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class _ProcessUtilization:  # c_nvmlProcessUtilizationSample_t
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int
    encUtil: int = 0
    decUtil: int = 0


@dataclass(frozen=True)
class _Handle:  # c_nvmlDevice_t: opaque to callers
    index: int


class FakeNvml:
    """pynvml's functions over a state file. `path` None: the file named by $JOBWARDEN_FAKE_NVML at each
    call (what the module-level functions use)."""

    NVMLError = NVMLError

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._path = path
        self._refcount = 0
        for name, code in _ERROR_NAMES.items():
            setattr(self, f"NVML_ERROR_{name}", code)

    def _state(self) -> dict[str, Any]:
        path = self._path if self._path is not None else os.environ.get(FAKE_NVML_ENV)
        try:
            with open(path or "", encoding="utf-8") as fh:
                state: dict[str, Any] = json.load(fh)
        except FileNotFoundError:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED) from None
        except ValueError:
            raise NVMLError(NVML_ERROR_UNKNOWN) from None
        return state

    def _live_state(self) -> dict[str, Any]:
        """The state for a call after nvmlInit: raises what the file says every call raises."""
        if self._refcount <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        state = self._state()
        if state.get("error"):
            raise _error(state["error"])
        return state

    def _device(self, handle: _Handle) -> dict[str, Any]:
        devices = self._live_state().get("devices", [])
        if not isinstance(handle, _Handle) or handle.index >= len(devices):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)  # the GPU this handle named is gone
        device: dict[str, Any] = devices[handle.index]
        if device.get("error"):
            raise _error(device["error"])
        return device

    def nvmlInit(self) -> None:
        state = self._state()
        if state.get("init_error"):
            raise _error(state["init_error"])
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        if self._refcount <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._system("driver_version"))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._system("cuda_driver_version"))

    def _system(self, key: str) -> Any:
        value = self._live_state().get(key)
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetCount(self) -> int:
        return len(self._live_state().get("devices", []))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index)
        self._device(handle)  # a lost GPU fails here already, as the real call does
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return str(self._device(handle).get("uuid", f"GPU-fake-{handle.index}"))

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return str(self._device(handle).get("name", "Fake GPU"))

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:
        device = self._device(handle)
        total = int(device.get("memory_total", 80 << 30))
        used = device.get("memory_used")
        if used is None:  # what the listed processes hold, each counted once (it may be in both lists)
            held: dict[int, int] = {}
            for p in [*(device.get("compute") or []), *(device.get("graphics") or [])]:
                held[p["pid"]] = max(held.get(p["pid"], 0), int(p.get("used") or 0))
            used = sum(held.values())
        return _Memory(total=total, free=max(0, total - int(used)), used=int(used))

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        util = self._device(handle).get("utilization", {"gpu": 0, "memory": 0})
        if util is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Utilization(gpu=int(util.get("gpu", 0)), memory=int(util.get("memory", 0)))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:
        return self._processes(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:
        return self._processes(handle, "graphics")

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        return self._clock(handle, "sm")

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, type: int) -> int:
        return self._clock(handle, "sm_max")

    def _clock(self, handle: _Handle, key: str) -> int:
        clocks = self._device(handle).get("clocks")
        if not clocks or clocks.get(key) is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(clocks[key])

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        reasons = self._device(handle).get("clock_reasons")
        if reasons is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(reasons)

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, timeStamp: int) -> list[_ProcessUtilization]:
        samples = self._device(handle).get("process_utilization")
        if samples is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [
            _ProcessUtilization(int(p["pid"]), timeStamp + 1, int(p.get("sm", 0)), int(p.get("mem", 0)))
            for p in samples
        ]

    def _processes(self, handle: _Handle, kind: str) -> list[_ProcessInfo]:
        entries = self._device(handle).get(kind, [])
        if entries is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [
            _ProcessInfo(int(p["pid"]), None if p.get("used") is None else int(p["used"])) for p in entries
        ]


# --- the module as a drop-in for pynvml: functions bound to $JOBWARDEN_FAKE_NVML --------------------

_default = FakeNvml()
nvmlInit = _default.nvmlInit
nvmlShutdown = _default.nvmlShutdown
nvmlDeviceGetCount = _default.nvmlDeviceGetCount
nvmlDeviceGetHandleByIndex = _default.nvmlDeviceGetHandleByIndex
nvmlDeviceGetUUID = _default.nvmlDeviceGetUUID
nvmlDeviceGetName = _default.nvmlDeviceGetName
nvmlDeviceGetMemoryInfo = _default.nvmlDeviceGetMemoryInfo
nvmlDeviceGetUtilizationRates = _default.nvmlDeviceGetUtilizationRates
nvmlDeviceGetComputeRunningProcesses = _default.nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses = _default.nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetClockInfo = _default.nvmlDeviceGetClockInfo
nvmlDeviceGetMaxClockInfo = _default.nvmlDeviceGetMaxClockInfo
nvmlDeviceGetCurrentClocksEventReasons = _default.nvmlDeviceGetCurrentClocksEventReasons
nvmlDeviceGetProcessUtilization = _default.nvmlDeviceGetProcessUtilization
nvmlSystemGetDriverVersion = _default.nvmlSystemGetDriverVersion
nvmlSystemGetCudaDriverVersion = _default.nvmlSystemGetCudaDriverVersion


# --- writing the state: for tests, and for test jobs that take or free a GPU -----------------------


def device(
    index: int, memory_total: int = 80 << 30, name: str = "Fake GPU", utilization: int = 0
) -> dict[str, Any]:
    """A GPU entry for the state file, with no process on it."""
    return {
        "uuid": f"GPU-fake-{index:04d}",
        "name": name,
        "memory_total": memory_total,
        "utilization": {"gpu": utilization, "memory": 0},
        "compute": [],
        "graphics": [],
        "error": None,
    }


def write_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Replace the state file atomically (write aside, then rename over it)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=1)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def update_state(path: str | os.PathLike[str], change: Callable[[dict[str, Any]], None]) -> None:
    """Read, change and write back the state under an exclusive lock: writers never lose updates."""
    target = Path(path)
    with _locked(target):
        try:
            state = json.loads(target.read_text(encoding="utf-8"))
        except FileNotFoundError:
            state = {"devices": []}
        change(state)
        write_state(target, state)


def hold(path: str | os.PathLike[str], gpu: int, pid: int, used: int | None, kind: str = "compute") -> None:
    """List `pid` as holding `used` bytes on GPU `gpu` (what a CUDA context does)."""

    def change(state: dict[str, Any]) -> None:
        entries = state["devices"][gpu].setdefault(kind, [])
        entries[:] = [p for p in entries if p["pid"] != pid] + [{"pid": pid, "used": used}]

    update_state(path, change)


def release(path: str | os.PathLike[str], pid: int) -> None:
    """Take `pid` off every GPU (what its exit does)."""

    def change(state: dict[str, Any]) -> None:
        for dev in state["devices"]:
            for kind in ("compute", "graphics"):
                if dev.get(kind):
                    dev[kind] = [p for p in dev[kind] if p["pid"] != pid]

    update_state(path, change)


def main(argv: list[str] | None = None) -> int:
    """`python -m jobwarden.probes.fakenvml hold GPU BYTES` (the caller's parent pid, or --pid) and
    `release`: for shell test jobs. The file is $JOBWARDEN_FAKE_NVML."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jobwarden.probes.fakenvml")
    sub = parser.add_subparsers(dest="action", required=True)
    take = sub.add_parser("hold")
    take.add_argument("gpu", type=int)
    take.add_argument("bytes", type=int)
    take.add_argument("--pid", type=int, default=os.getppid())
    free = sub.add_parser("release")
    free.add_argument("--pid", type=int, default=os.getppid())
    args = parser.parse_args(argv)
    path = os.environ.get(FAKE_NVML_ENV)
    if not path:
        print(f"set {FAKE_NVML_ENV} to the state file", file=sys.stderr)
        return 2
    if args.action == "hold":
        hold(path, args.gpu, args.pid, args.bytes)
    else:
        release(path, args.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())

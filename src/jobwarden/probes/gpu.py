"""The GPUs as NVML sees them: devices (memory, utilisation) and the processes holding memory on each.

`pynvml` (the nvidia-ml-py package, extra `jobwarden[gpu]`) is imported only when a probe is opened, so
jobs without GPUs never load it. JOBWARDEN_FAKE_NVML=/path/state.json puts `fakenvml` in its place.

Errors, decided once here (the shim's loop must survive a GPU falling off the bus or a driver reload):

- NVML as a whole cannot answer (driver unloaded or reloading, library/driver mismatch, NVML gone):
  `devices()`/`processes()` raise `GpuProbeError` and nothing else. Not an empty list: "no process holds
  GPU 0" would let a queued job onto a GPU that may be busy, and "0 bytes" would look like an idle job.
  The probe re-initialises NVML on its next call, so it recovers once the driver is back.
- One GPU cannot answer (lost, reset required, no permission: NVML counts devices a user may not open):
  it is left out of the results and named in `probe.device_errors` (index -> why) until the next call.
  A GPU left out is never free for admission, and its processes are not listed.
- Utilisation unsupported (some boards, MIG): `utilization_percent` None. A process whose memory NVML
  cannot report: `used_bytes` None, never guessed as 0.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from jobwarden.errors import JobwardenError
from jobwarden.observations import GpuDevice, GpuProcess

FAKE_NVML_ENV = "JOBWARDEN_FAKE_NVML"
_T = TypeVar("_T")

# Every NVML function the probe calls, with the positional arguments it passes (tests check that pynvml
# and the fake both accept exactly these calls)
NVML_CALLS: dict[str, int] = {
    "nvmlInit": 0,
    "nvmlShutdown": 0,
    "nvmlDeviceGetCount": 0,
    "nvmlDeviceGetHandleByIndex": 1,
    "nvmlDeviceGetUUID": 1,
    "nvmlDeviceGetName": 1,
    "nvmlDeviceGetMemoryInfo": 1,
    "nvmlDeviceGetUtilizationRates": 1,
    "nvmlDeviceGetComputeRunningProcesses": 1,
    "nvmlDeviceGetGraphicsRunningProcesses": 1,
    "nvmlDeviceGetClockInfo": 2,
    "nvmlDeviceGetMaxClockInfo": 2,
    "nvmlDeviceGetCurrentClocksEventReasons": 1,
    "nvmlSystemGetDriverVersion": 0,
    "nvmlSystemGetCudaDriverVersion": 0,
}
NVML_CLOCK_SM = 1  # nvmlClockType_t

# Codes after which no call can succeed until NVML is initialised again (nvml.h)
_LIBRARY_WIDE = {
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
}
NVML_CONSTANTS = (*sorted(_LIBRARY_WIDE), "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION")

_INSTALL_HINT = "pip install 'jobwarden[gpu]' (it adds nvidia-ml-py)"
_REMEDIES = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "no NVIDIA driver here (libnvidia-ml.so.1 is missing); install one, "
    "or run GPU jobs on a machine with GPUs",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded; check `nvidia-smi`",
    "NVML_ERROR_NO_PERMISSION": "not allowed to open the GPUs; check the permissions of /dev/nvidia*",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the driver was upgraded without a reboot; reboot, or reload "
    "the nvidia kernel modules",
}


class GpuProbeError(JobwardenError):
    """NVML could not answer at all (see the module's doc). The probe retries by itself on its next call."""


@dataclass(frozen=True)
class GpuUnavailable:
    """Why no GPU probe could be opened on this machine (for `doctor`, and for a job that asks for GPUs)."""

    reason: str
    remedy: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.remedy})"


class _DeviceError(Exception):
    """One GPU failed; the others can still be read."""


def _text(value: object) -> str:
    """Old pynvml releases return bytes for names and UUIDs, newer ones str."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class GpuProbe:
    """A live NVML session. Each call reads fresh state; handles are not kept, because a GPU that fell off
    the bus or a driver reload makes them dangle."""

    def __init__(self, nvml: Any, source: str) -> None:
        self._nvml = nvml
        self.source = source  # "nvml" or "fake:PATH", for doctor
        self.device_errors: dict[int, str] = {}
        self._stale = False
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed and not self._stale:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._closed = True

    # --- reading ----------------------------------------------------------------------------------

    def devices(self) -> list[GpuDevice]:
        return self._each_device(self._device)

    def processes(self) -> list[GpuProcess]:
        """Compute and graphics processes on every readable GPU, one entry per (GPU, pid)."""
        return [p for procs in self._each_device(self._processes_on) for p in procs]

    def versions(self) -> tuple[str | None, int | None]:
        """The driver's version ("550.54.15") and the newest CUDA it supports (12040 for 12.4); None
        where NVML does not say."""
        self._ensure_open()
        driver = self._call(self._nvml.nvmlSystemGetDriverVersion, optional=True)
        cuda = self._call(self._nvml.nvmlSystemGetCudaDriverVersion, optional=True)
        return None if driver is None else _text(driver), None if cuda is None else int(cuda)

    def _each_device(self, read: Callable[[int, Any], _T]) -> list[_T]:
        self._ensure_open()
        count = self._call(self._nvml.nvmlDeviceGetCount)
        found: list[_T] = []
        errors: dict[int, str] = {}
        for index in range(int(count)):
            try:
                handle = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index, device=True)
                found.append(read(index, handle))
            except _DeviceError as err:
                errors[index] = str(err)
        self.device_errors = errors
        return found

    def _device(self, index: int, handle: Any) -> GpuDevice:
        memory = self._call(self._nvml.nvmlDeviceGetMemoryInfo, handle, device=True)
        return GpuDevice(
            index=index,
            uuid=_text(self._call(self._nvml.nvmlDeviceGetUUID, handle, device=True)),
            name=_text(self._call(self._nvml.nvmlDeviceGetName, handle, device=True)),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            utilization_percent=self._utilization(handle),
            sm_clock_mhz=self._optional_int(self._nvml.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_SM),
            sm_clock_max_mhz=self._optional_int(self._nvml.nvmlDeviceGetMaxClockInfo, handle, NVML_CLOCK_SM),
            # "Throttle" was its name before NVML 12.5; a binding with neither reads as not supported
            clock_reasons=self._optional_int(
                getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or getattr(self._nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
                handle,
            ),
        )

    def _optional_int(self, fn: Callable[..., Any] | None, *args: Any) -> int | None:
        """A reading some boards do not offer (NOT_SUPPORTED): None, never a failed sample."""
        if fn is None:
            return None
        value = self._call(fn, *args, device=True, optional=True)
        return None if value is None else int(value)

    def _utilization(self, handle: Any) -> float | None:
        rates = self._call(self._nvml.nvmlDeviceGetUtilizationRates, handle, device=True, optional=True)
        return None if rates is None else float(rates.gpu)

    def _processes_on(self, index: int, handle: Any) -> list[GpuProcess]:
        merged: dict[int, GpuProcess] = {}
        for kind, read in (
            ("compute", self._nvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", self._nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for info in self._call(read, handle, device=True, optional=True) or ():
                merged[int(info.pid)] = _merge(merged.get(int(info.pid)), index, info, kind)
        return sorted(merged.values(), key=lambda p: p.pid)

    # --- errors -----------------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed:
            raise GpuProbeError("the GPU probe is closed")
        if self._stale:  # after a driver reload NVML must be initialised again
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._call(self._nvml.nvmlInit)
            self._stale = False

    def _call(self, fn: Callable[..., Any], *args: Any, device: bool = False, optional: bool = False) -> Any:
        """Call NVML, translating its errors (see the module's doc). `optional`: NOT_SUPPORTED -> None."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            name = _code_name(self._nvml, err)
            if optional and name == "NVML_ERROR_NOT_SUPPORTED":
                return None
            if device and name not in _LIBRARY_WIDE:
                raise _DeviceError(str(err) or name) from err
            self._stale = True
            raise GpuProbeError(
                f"cannot read the GPUs: {err or name}",
                _REMEDIES.get(name or "", "jobwarden tries again on its next read"),
            ) from err
        except Exception as err:  # a binding out of step with the driver: still never into the caller
            self._stale = True
            raise GpuProbeError(f"cannot read the GPUs: {type(err).__name__}: {err}") from err


def _code_name(nvml: Any, err: Exception) -> str | None:
    """The NVML_ERROR_* name of an NVMLError, for the codes the probe treats specially."""
    value = getattr(err, "value", None)
    for name in NVML_CONSTANTS:
        if getattr(nvml, name, object()) == value:
            return name
    return None


def _merge(seen: GpuProcess | None, index: int, info: Any, kind: str) -> GpuProcess:
    """One process may be in both lists (CUDA/graphics interop): one entry, kind 'compute+graphics'."""
    used = None if info.usedGpuMemory is None else int(info.usedGpuMemory)
    if seen is None:
        return GpuProcess(gpu_index=index, pid=int(info.pid), used_bytes=used, kind=kind)
    known = [b for b in (seen.used_bytes, used) if b is not None]
    return GpuProcess(index, seen.pid, max(known) if known else None, f"{seen.kind}+{kind}")


# --- opening ------------------------------------------------------------------------------------------


# The NVIDIA kernel driver's own files: without them this machine has no GPU NVML could show, whatever
# is installed (the binding's absence is then beside the point)
DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
NO_GPUS = GpuUnavailable(
    "this machine has no GPUs: no NVIDIA driver (" + " and ".join(DRIVER_FILES) + " are missing)",
    "run it without --gpus/--gpu-ids, or on a machine with GPUs",
)


def nvidia_driver_present() -> bool:
    return any(os.path.exists(path) for path in DRIVER_FILES)


def try_open_gpu_probe(environ: Mapping[str, str] = os.environ) -> GpuProbe | GpuUnavailable:
    """A probe over NVML (or over the fake named by JOBWARDEN_FAKE_NVML), or why there is none."""
    fake = environ.get(FAKE_NVML_ENV)
    if fake:
        from jobwarden.probes.fakenvml import FakeNvml

        nvml: Any = FakeNvml(fake)
        source = f"fake:{fake}"
    else:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            if not nvidia_driver_present():
                return NO_GPUS
            return GpuUnavailable("the NVML binding (pynvml) is not installed", _INSTALL_HINT)
        source = "nvml"
    try:
        nvml.nvmlInit()
    except Exception as err:
        name = _code_name(nvml, err)
        if not fake and name == "NVML_ERROR_LIBRARY_NOT_FOUND" and not nvidia_driver_present():
            return NO_GPUS
        return GpuUnavailable(
            f"NVML cannot start: {err or type(err).__name__}",
            _REMEDIES.get(name or "", "check that `nvidia-smi` works"),
        )
    return GpuProbe(nvml, source)


def open_gpu_probe(environ: Mapping[str, str] = os.environ) -> GpuProbe | None:
    """A probe, or None when this machine has no usable NVML (`try_open_gpu_probe` says why)."""
    probe = try_open_gpu_probe(environ)
    return probe if isinstance(probe, GpuProbe) else None


# --- one job's share --------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobGpuUsage:
    """GPU memory and utilisation of one job's processes at one moment.

    Utilisation is NVML's per-GPU figure: on a GPU shared with another job it counts their work too."""

    bytes_by_pid: dict[int, int | None]  # summed over GPUs; None: NVML reported no figure at all
    total_bytes: int  # of the known figures
    gpus: tuple[int, ...]  # GPUs where the job holds memory (or has a context)
    utilization: dict[int, float | None]  # GPU index -> percent
    complete: bool  # NVML gave every figure: total_bytes is not an undercount

    @property
    def max_utilization(self) -> float | None:
        known = [u for u in self.utilization.values() if u is not None]
        return max(known) if known else None


def job_gpu_usage(
    devices: Sequence[GpuDevice], processes: Sequence[GpuProcess], pids: Iterable[int]
) -> JobGpuUsage:
    """The share of `pids` (a job's live processes) in one probe reading."""
    wanted = set(pids)
    by_pid: dict[int, int | None] = {}
    gpus: set[int] = set()
    complete = True
    for proc in processes:
        if proc.pid not in wanted:
            continue
        gpus.add(proc.gpu_index)
        complete = complete and proc.used_bytes is not None
        known = by_pid.get(proc.pid)
        if proc.used_bytes is not None:
            by_pid[proc.pid] = (known or 0) + proc.used_bytes
        else:
            by_pid.setdefault(proc.pid, None)
    util = {d.index: d.utilization_percent for d in devices if d.index in gpus}
    return JobGpuUsage(
        bytes_by_pid=by_pid,
        total_bytes=sum(b for b in by_pid.values() if b is not None),
        gpus=tuple(sorted(gpus)),
        utilization={i: util.get(i) for i in sorted(gpus)},
        complete=complete,
    )

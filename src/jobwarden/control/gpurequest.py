"""`run --gpus N` / `--gpu-ids I,J` that this machine can never meet, refused at once: before the job is
recorded, so a refused start is never a failed job in the lists. A request that can be met later (the
GPUs are busy) waits `queued` in the shim (shim.admission.resources.GpuQueue)."""

from __future__ import annotations

from jobwarden.errors import UsageError
from jobwarden.joboptions import JobOptions


def refuse_impossible_gpus(options: JobOptions) -> None:
    """Raise a usage error naming the flag when there are no GPUs here, or fewer than asked for."""
    from jobwarden.probes.gpu import GpuProbe, GpuProbeError, try_open_gpu_probe  # NVML: only with --gpus
    from jobwarden.rules.gpurequest import GpuRequest, impossible_request

    request = GpuRequest.from_options(options)
    if request is None:
        return
    flag = "--gpu-ids" if request.ids is not None else "--gpus"
    probe = try_open_gpu_probe()
    if not isinstance(probe, GpuProbe):
        raise UsageError(f"{flag}: {probe.reason}", probe.remedy)
    try:
        total = len(probe.devices()) + len(probe.device_errors)
    except GpuProbeError:
        return  # NVML cannot answer just now (a driver reload): the shim waits and asks again
    finally:
        probe.close()
    why = impossible_request(request, total)
    if why:
        raise UsageError(f"{flag}: {why}", f"ask for at most {total}" if total else "")

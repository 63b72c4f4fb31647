"""The job's GPU use, sampled by the shim every few seconds: memory held by its processes and the
utilisation of the GPUs they are on. It feeds the hang watchdog (GPU work is progress) and the `gpu-idle`
rule: memory held while the GPUs do nothing, the S5 seed case of a finished experiment whose leftover
loop kept 5 GiB for days."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded only where a GPU may be: a CPU-only job's shim never imports NVML's probe
    from jobwarden.observations import GpuDevice, GpuProcess
    from jobwarden.probes.gpu import GpuProbe, JobGpuUsage

FAKE_NVML_ENV = "JOBWARDEN_FAKE_NVML"  # probes.fakenvml's, without loading it (tempfile, dataclasses)

SAMPLE_EVERY_S = 5.0  # NVML calls cost milliseconds each; utilisation is itself an average over ~1 s
IDLE_PERCENT = 5.0


class GpuWatch:
    def __init__(self, probe: GpuProbe) -> None:
        self.probe = probe
        self.devices: list[GpuDevice] = []
        self.processes: list[GpuProcess] = []  # the job's own
        self.others: list[GpuProcess] = []  # everyone else's (the speed watch's gpu-shared)
        self.usage: JobGpuUsage | None = None
        self.error: str | None = None
        self._next = 0.0
        self._idle_since: float | None = None

    def sample(self, now_mono: float, pids: Iterable[int]) -> JobGpuUsage | None:
        """A fresh reading at most every SAMPLE_EVERY_S; the last one in between. Never raises: a GPU that
        fell off the bus must not end supervision."""
        if now_mono < self._next:
            return self.usage
        from jobwarden.probes.gpu import GpuProbeError, job_gpu_usage

        self._next = now_mono + SAMPLE_EVERY_S
        wanted = set(pids)
        try:
            self.devices = self.probe.devices()
            every = self.probe.processes()
        except GpuProbeError as err:
            self.error, self.usage = err.message, None
            return None
        held = [p for p in every if p.pid in wanted]
        self.others = [p for p in every if p.pid not in wanted]
        self.error, self.processes = None, held
        self.usage = job_gpu_usage(self.devices, held, wanted)
        util = self.usage.max_utilization
        idle = self.usage.total_bytes > 0 and util is not None and util < IDLE_PERCENT
        if not idle:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now_mono
        return self.usage

    def idle_for(self, now_mono: float) -> float | None:
        """How long the job has held GPU memory at ~0% utilisation (None: not idle, or unknown)."""
        return None if self._idle_since is None else now_mono - self._idle_since

    def close(self) -> None:
        self.probe.close()


def gpus_expected(claimed: bool = False) -> bool:
    """NVML is asked only for jobs that claimed GPUs or on machines with an NVIDIA driver: importing and
    initialising it costs the shim tens of milliseconds, for nothing on a CPU-only machine."""
    return claimed or os.path.exists("/dev/nvidiactl") or FAKE_NVML_ENV in os.environ


def open_gpu_watch(claimed: bool) -> GpuWatch | None:
    if not gpus_expected(claimed):
        return None
    from jobwarden.probes.gpu import GpuProbe, try_open_gpu_probe

    probe = try_open_gpu_probe()
    return GpuWatch(probe) if isinstance(probe, GpuProbe) else None

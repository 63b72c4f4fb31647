"""What a run may use, kept by the shim: memory (--mem-limit, OOM evidence) and GPUs (--gpus queueing)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from jobwarden.clock import Clock
from jobwarden.errors import JobwardenError, StoreError
from jobwarden.model import JobState
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.memory import MemoryWatchdog, tree_memory
from jobwarden.probes.oom import OomCounters, OomWatch
from jobwarden.store import JobRecord, Store

if TYPE_CHECKING:  # the GPU side loads with a GpuQueue only: a job that asked for no GPU never needs it
    from jobwarden.observations import OomEvidence
    from jobwarden.shim.admission.gpus import Admission, GpuRequest


class MemoryGuard:
    """--mem-limit and the OOM evidence of one run. The limit is the cgroup's own where it has a memory
    controller (the kernel's OOM killer enforces it and counts its kills); else jobwarden's watchdog over
    the tree's memory ends the job, as the OOM killer would."""

    def __init__(
        self, cgroup: JobCgroup | None, limit_bytes: int | None, procfs: ProcFS, log: Callable[[str], None]
    ) -> None:
        self.cgroup, self.procfs = cgroup, procfs
        self.watchdog: MemoryWatchdog | None = None
        self.oom_watch: OomWatch | None = None
        self.latest: OomEvidence | None = None
        if not limit_bytes:
            return
        if cgroup and cgroup.has_memory_controller:
            try:
                cgroup.set_memory_limit(limit_bytes)
                return
            except JobwardenError as err:
                log(f"cannot set the cgroup memory limit ({err.message}); watching the tree instead")
        self.watchdog = MemoryWatchdog(limit_bytes)

    def start(self, fresh_cgroup: bool = False, before: OomCounters | None = None) -> None:
        """The counters' baseline, so only this run's kills count. Taken once `run` has its answer,
        milliseconds (on a loaded machine, seconds) after the job started: a cgroup made for the job
        counts from zero, any other from the counters read `before` the job started."""
        self.oom_watch = OomWatch(self.cgroup)
        self.oom_watch.baseline(fresh_cgroup=fresh_cgroup, before=before)

    def poll(self, pids: Sequence[int] | None = None) -> OomEvidence | None:
        """New OOM evidence since the last call (counters, kernel log), else None."""
        found = self.oom_watch.poll(pids) if self.oom_watch else None
        if found is None or found == self.latest:
            return None
        self.latest = found
        return found

    def over_limit(self, pids: Sequence[int], members: Sequence[int]) -> OomEvidence | None:
        """The watchdog's verdict on one sample: evidence to record (then end the tree), or None."""
        if self.watchdog is None:
            return None
        total = tree_memory(self.procfs, pids, exact_above=self.watchdog.limit_bytes)
        if not self.watchdog.check(total):
            return None
        self.latest = self.watchdog.evidence(sorted(members))
        return self.latest

    def close(self) -> None:
        if self.oom_watch:
            self.oom_watch.close()


class GpuQueue:
    """A run that asked for GPUs: claim them when free (atomically against other jobwarden jobs, in the
    store), and while it cannot, say what it waits for and name, once, any stray process holding them."""

    def __init__(
        self, store: Store, job: JobRecord, run: int, procfs: ProcFS, clock: Clock, request: GpuRequest
    ) -> None:
        self.store, self.job, self.run, self.procfs, self.clock = store, job, run, procfs, clock
        from jobwarden.probes.gpu import try_open_gpu_probe

        self.request = request
        self.probe = try_open_gpu_probe()
        self._strays_named = False

    def try_claim(self) -> Admission:
        from jobwarden.shim.admission.gpus import try_admit

        return try_admit(
            self.store,
            self.job.id,
            self.run,
            self.probe,
            None if self.request.ids else self.request.count,
            self.request.ids,
            now=self.clock.wall(),
            procfs=self.procfs,
        )

    def note_waiting(self, admission: Admission) -> None:
        """queued: `status` shows why; the first time, a stray-gpu-process finding for each GPU held by a
        process of no live job (a leftover loop), with its remedy."""
        from jobwarden.observations import GpuProcess
        from jobwarden.rules.gpu import stray_gpu_findings
        from jobwarden.shim.admission.gpuholders import gpu_owners
        from jobwarden.shim.admission.gpus import describe_wait

        now = self.clock.wall()
        try:
            self.store.update_run(
                self.job.id, self.run, state=JobState.QUEUED, queued_reason=describe_wait(admission)
            )
            if not self._strays_named:
                self._strays_named = True
                holders = [h for busy in admission.busy for h in busy.holders]
                procs = [GpuProcess(h.gpu_index, h.pid, h.used_bytes) for h in holders]
                for finding in stray_gpu_findings(procs, gpu_owners(holders, now)):
                    self.store.add_finding(self.job.id, self.run, now, finding)
        except StoreError:
            pass  # shown again at the next try

    def claimed(self, admission: Admission) -> None:
        """queued -> starting: the GPUs are ours."""
        now = self.clock.wall()
        self.store.update_run(self.job.id, self.run, state=JobState.STARTING, queued_reason=None)
        self.store.add_event(self.job.id, self.run, "gpus-claimed", now, gpus=list(admission.claimed))

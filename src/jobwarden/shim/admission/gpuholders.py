"""Who holds a GPU: each process NVML lists, mapped to its jobwarden job (by the shim's records or the
JOBWARDEN_* markers in its environment), or named a stray when it belongs to no live job. Used by the
admission queue to say whom a run waits for, by `orphans`, and by the `stray-gpu-process` finding."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from jobwarden.errors import AccessDenied, JobNotFound, ProcessGone
from jobwarden.model import ACTIVE_STATES, JobState
from jobwarden.observations import GpuProcess
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.users import user_name
from jobwarden.probes.gpu import GpuProbe
from jobwarden.probes.markers import read_job_marks
from jobwarden.rules.gpu import GpuOwner
from jobwarden.store import Store

# Same set Store.claim_gpus keeps claims for: a lost run's processes may still be using its GPUs
_LIVE = frozenset(ACTIVE_STATES | {JobState.LOST})


def run_is_live(store: Store, job_id: int, run: int) -> bool:
    try:
        return store.run(job_id, run).state in _LIVE
    except JobNotFound:  # removed with `rm`
        return False


def job_name(store: Store, job_id: int) -> str | None:
    try:
        return store.job(job_id).name
    except JobNotFound:  # removed with `rm` while its process lived on
        return None


@dataclass(frozen=True)
class GpuHolder:
    """A process holding memory on a GPU, and whose it is. `job_id`/`run` come from the shim's records or
    the JOBWARDEN_* markers in its environment; `live_job`: that run is still live here."""

    pid: int
    gpu_index: int
    used_bytes: int | None
    kind: str
    visible: bool  # False: NVML lists a pid /proc does not show (another PID namespace)
    uid: int | None = None
    user: str | None = None
    cmdline: str = ""
    ppid: int | None = None
    start_time: int | None = None  # clock ticks after boot: with pid, its identity (for a kill)
    started_at: float | None = None  # wall clock
    job_id: int | None = None
    run: int | None = None
    job_name: str | None = None
    home: str | None = None  # JOBWARDEN_HOME it was started under
    foreign: bool = False  # marked by another jobwarden home: its job is not ours to judge
    live_job: bool = False
    reparented_to_init: bool = False

    @property
    def stray(self) -> bool:
        """A compute process that belongs to no live job we know of (the `stray-gpu-process` finding and
        `orphans`). Graphics-only processes are never strays: that is the desktop's Xorg, not a job."""
        return self.visible and "compute" in self.kind and not self.live_job and not self.foreign

    def label(self) -> str:
        """'job 12 (train) pid 4242', or 'stray pid 999 (user ana, python loop.py)'."""
        job = f"job {self.job_id}" + (f" ({self.job_name})" if self.job_name else "")
        if not self.visible:
            return f"pid {self.pid} (not visible here: another container or PID namespace?)"
        who = f"user {self.user}, {_short(self.cmdline)}"
        if self.live_job:
            return f"{job} pid {self.pid}"
        if self.foreign:
            return f"pid {self.pid} of jobwarden job {self.job_id} under {self.home} ({who})"
        if "compute" not in self.kind:
            return f"graphics pid {self.pid} ({who})"
        if self.job_id is not None:
            return f"stray pid {self.pid} (left by {job} run {self.run}, {who})"
        return f"stray pid {self.pid} ({who})"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stray": self.stray, "label": self.label()}


def gpu_owners(holders: Sequence[GpuHolder], now: float) -> dict[int, GpuOwner]:
    """What `rules.gpu.stray_gpu_findings` may judge, by pid. Left out, as it leaves out pids /proc does
    not show: graphics-only processes (a desktop, never a stray) and those of another jobwarden home."""
    return {
        h.pid: GpuOwner(
            pid=h.pid,
            ppid=h.ppid or 0,
            user=h.user or "?",
            cmdline=h.cmdline,
            job_id=None if h.job_id is None else str(h.job_id),
            job_live=h.live_job,
            age_s=None if h.started_at is None else max(0.0, now - h.started_at),
        )
        for h in holders
        if h.visible and "compute" in h.kind and not h.foreign
    }


def gpu_holders(store: Store, probe: GpuProbe, procfs: ProcFS) -> list[GpuHolder]:
    """Every process holding GPU memory, mapped to its job. Raises GpuProbeError when NVML cannot
    answer (see probes.gpu)."""
    return holders_of(store, probe.processes(), procfs)


def holders_of(store: Store, processes: Sequence[GpuProcess], procfs: ProcFS) -> list[GpuHolder]:
    """`gpu_holders` over processes already read from the probe."""
    jobs = _Jobs(store)
    return [_holder(jobs, procfs, proc) for proc in processes]


class _Jobs:
    """What the store says about whose a process is, read once per call."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.home = str(store.layout.home)
        self.store_id = store.store_id
        self.members: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, start) -> (job, run)
        for run in store.latest_runs().values():
            if run.state in _LIVE:
                for p in store.processes(run.job_id, run.n, live_only=True):
                    self.members[(p.pid, p.start_time)] = (run.job_id, run.n)
        self._names: dict[int, str | None] = {}

    def name(self, job_id: int) -> str | None:
        if job_id not in self._names:
            self._names[job_id] = job_name(self.store, job_id)
        return self._names[job_id]

    def live(self, job_id: int, run: int | None) -> bool:
        if run is None:
            with contextlib.suppress(JobNotFound):
                run = self.store.run(job_id).n
        return run is not None and run_is_live(self.store, job_id, run)


def _holder(jobs: _Jobs, procfs: ProcFS, proc: GpuProcess) -> GpuHolder:
    base = GpuHolder(proc.pid, proc.gpu_index, proc.used_bytes, proc.kind, visible=False)
    try:
        st = procfs.stat(proc.pid)
        uid, cmdline = procfs.uid(proc.pid), procfs.cmdline(proc.pid)
    except (ProcessGone, AccessDenied):
        return base
    owner = jobs.members.get((proc.pid, st.start_time))
    marks = None
    with contextlib.suppress(ProcessGone, AccessDenied):  # another user's environment is closed to us
        marks = read_job_marks(procfs, proc.pid)
    other_store = marks is not None and marks.store not in (None, jobs.store_id)
    foreign = marks is not None and (marks.home != jobs.home or other_store) and owner is None
    job_id, run = owner if owner else (marks.job_id, marks.run) if marks else (None, None)
    return dataclasses.replace(
        base,
        visible=True,
        uid=uid,
        user=user_name(uid),
        cmdline=cmdline,
        ppid=st.ppid,
        start_time=st.start_time,
        started_at=_started_at(procfs, st.start_time),
        job_id=job_id,
        run=run,
        job_name=jobs.name(job_id) if job_id is not None and not foreign else None,
        home=marks.home if marks else jobs.home if owner else None,
        foreign=foreign,
        live_job=owner is not None or (job_id is not None and not foreign and jobs.live(job_id, run)),
        reparented_to_init=st.ppid == 1,
    )


def _started_at(procfs: ProcFS, start_ticks: int) -> float | None:
    try:
        return procfs.wall_time_of(start_ticks)
    except OSError:
        return None


def _short(cmdline: str, width: int = 40) -> str:
    return cmdline if len(cmdline) <= width else cmdline[: width - 3] + "..."


def format_gpu_bytes(n: int | None) -> str:
    if n is None:
        return "memory n/a"
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"

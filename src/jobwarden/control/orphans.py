"""`jobwarden orphans`: every process that should not be alive any more (DESIGN seed case S5).

Two kinds of strays:

- processes of this store's jobs whose run ended, whose supervisor died, or whose job was removed. They are
  found by their JOBWARDEN_* marker, and by the (pid, start time) the shim recorded: the only way to see
  another user's process (started through sudo, say), whose environment we may not read;
- processes holding GPU memory that belong to no live job and were reparented to init or a subreaper:
  the parent that would have ended them is gone (the 1.5-day training loop of S5).

Nothing here signals anything; `control.killer` ends what the user chooses to end.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from jobwarden.clock import iso
from jobwarden.config import format_duration, format_size
from jobwarden.control.views.joblist import refresh
from jobwarden.errors import AccessDenied, JobNotFound, JobwardenError, ProcessGone
from jobwarden.model import JobState
from jobwarden.observations import GpuProcess
from jobwarden.osapi.capabilities import in_initial_pid_namespace
from jobwarden.osapi.procfs import ProcFS, ProcStat
from jobwarden.osapi.users import user_name
from jobwarden.probes.markers import read_job_marks
from jobwarden.store import JobRecord, RunRecord, Store

# Processes that adopt orphans: init of the host or of a container, and the usual subreapers (systemd's
# user manager, container inits). A GPU holder whose parent is one of these has lost its real parent.
_ADOPTERS = frozenset(
    {"systemd", "init", "tini", "dumb-init", "catatonit", "docker-init", "s6-svscan", "runsvdir"}
)

# A process's start as a wall time is only as precise as the boot time in /proc/stat: whole seconds
_START_SLACK_S = 2.0


@dataclass(frozen=True)
class Stray:
    """A process that should not be alive, with where it came from and why it is listed."""

    pid: int
    start_time: int
    ppid: int
    pgid: int
    uid: int | None
    user: str
    state: str
    command: str
    started_at: float | None  # wall clock
    rss_bytes: int
    reason: str
    job: int | None = None
    run: int | None = None
    job_name: str | None = None
    gpu_memory_bytes: int | None = None
    gpus: tuple[int, ...] = field(default=())

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "pid": self.pid,
            "user": self.user,
            "command": self.command,
            "reason": self.reason,
            "job": self.job,
            "run": self.run,
            "job_name": self.job_name,
            "uid": self.uid,
            "ppid": self.ppid,
            "pgid": self.pgid,
            "state": self.state,
            "start_time": self.start_time,
            "started_at": iso(self.started_at),
            "age_s": round(now - self.started_at, 1) if self.started_at is not None else None,
            "rss_bytes": self.rss_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "gpus": list(self.gpus),
        }


def stray_reason(
    job_id: int, run_n: int | None, job: JobRecord | None, run: RunRecord | None, now: float
) -> str | None:
    """Why a process of job `job_id` (run `run_n`) should not be alive; None while its run is live.
    `run` is the run as it really is (a watched run whose shim died already reads `lost`)."""
    if job is None:
        return f"job {job_id} was removed"
    if run is None:
        return f"job {job_id} has no run {run_n} on record"
    if run.state.is_ended:
        when = f" {format_duration(now - run.ended_at)} ago" if run.ended_at is not None else ""
        return f"job {job_id} run {run.n} ended{when} ({run.state})"
    if run.state == JobState.LOST:
        return f"supervisor of job {job_id} died"
    return None


@dataclass(frozen=True)
class _Verdict:
    job: JobRecord | None
    run: RunRecord | None
    reason: str | None


class StrayFinder:
    """One look at the machine against one store. `exclude`: pids never listed (the caller and its
    ancestors: `jobwarden orphans` run from inside a job must not list itself)."""

    def __init__(
        self,
        store: Store,
        procfs: ProcFS,
        now: float,
        exclude: Iterable[int] = (),
        host_pids: bool = True,
    ) -> None:
        self.store, self.procfs, self.now = store, procfs, now
        self.host_pids = host_pids  # False in a container: NVML's pids may name other processes here
        self.exclude = set(exclude)
        home = store.layout.home
        self._homes = {str(home), os.path.realpath(home)}
        self._jobs = {job.id: job for job in store.jobs()}
        self._verdicts: dict[tuple[int, int | None], _Verdict] = {}
        self._boot: float | None = None
        self._live_marked: set[int] = set()  # pids carrying the marker of a live run
        self._live_idents: set[tuple[int, int]] | None = None
        self._recorded_by_job: dict[int, set[tuple[int, int]]] = {}

    def find(self, gpu_processes: Sequence[GpuProcess] = ()) -> list[Stray]:
        strays: dict[tuple[int, int], Stray] = {}
        for stray in [*self._marked(), *self._recorded()]:
            strays.setdefault((stray.pid, stray.start_time), stray)
        by_pid = {s.pid: key for key, s in strays.items()}
        for pid, (used, gpus) in _gpu_usage(gpu_processes).items():
            if pid in by_pid:
                key = by_pid[pid]
                strays[key] = _with_gpu(strays[key], used, gpus)
            elif pid not in self.exclude:
                holder = self._gpu_stray(pid, used, gpus)
                if holder:
                    strays[(holder.pid, holder.start_time)] = holder
        return sorted(strays.values(), key=lambda s: (s.job is None, s.job or 0, s.run or 0, s.pid))

    # --- judging runs -----------------------------------------------------------------------------

    def _verdict(self, job_id: int, run_n: int | None) -> _Verdict:
        key = (job_id, run_n)
        if key not in self._verdicts:
            job = self._jobs.get(job_id)
            run = None
            if job is not None:
                try:
                    run = refresh(self.store, self.procfs, job, self.store.run(job_id, run_n))
                except JobNotFound:
                    run = None
            self._verdicts[key] = _Verdict(job, run, stray_reason(job_id, run_n, job, run, self.now))
        return self._verdicts[key]

    # --- the sources ------------------------------------------------------------------------------

    def _marked(self) -> Iterable[Stray]:
        """Live processes carrying this store's marker, whose run is over."""
        for st in self.procfs.iter_stats():
            if st.state in ("Z", "X") or st.pid in self.exclude:
                continue
            try:
                marker = read_job_marks(self.procfs, st.pid)
            except (ProcessGone, AccessDenied):
                continue  # another user's environment: found through the store's records instead
            if marker is None or not self._is_our_home(marker.home):
                continue
            if marker.store is not None and marker.store != self.store.store_id:
                stray = self._of_earlier_store(st, marker.job_id, marker.store)
                if stray:
                    yield stray
                continue
            verdict = self._verdict(marker.job_id, marker.run)
            if verdict.reason is None:
                self._live_marked.add(st.pid)
                continue
            if self._kept_or_started_by_kept(verdict.run, st):
                continue  # left running on purpose (--keep-running): `jobwarden stop JOB` ends it
            if not self._may_come_from(st, verdict.run) or not self._started_by_the_job(st, marker.job_id):
                continue
            stray = self._stray(st, verdict.reason, marker.job_id, verdict)
            if stray:
                yield stray

    def _of_earlier_store(self, st: ProcStat, job_id: int, store: str) -> Stray | None:
        """Marked by another database of this home (emptied or moved aside since): its job id names
        another job now, so it is nobody's here."""
        if not self._may_come_from(st, None):
            return None
        reason = f"its job {job_id} belongs to an earlier database of this home (store {store})"
        return self._stray(st, reason, None, None)

    def _recorded(self) -> Iterable[Stray]:
        """Processes the shims recorded for runs that are over, still alive with the same start time."""
        for job in self._jobs.values():
            try:
                latest = self.store.run(job.id).n
            except JobNotFound:
                continue  # removed while we looked
            for n in range(1, latest + 1):
                verdict = self._verdict(job.id, n)
                if verdict.reason is None or verdict.run is None:
                    continue
                idents = {(p.pid, p.start_time) for p in self.store.processes(job.id, n, live_only=True)}
                if verdict.run.pid and verdict.run.pid_start:
                    idents.add((verdict.run.pid, verdict.run.pid_start))
                for pid, start in sorted(idents):
                    st = self._live_stat(pid, start)
                    if st is not None and pid not in self.exclude and not _kept(verdict.run, pid, start):
                        stray = self._stray(st, verdict.reason, job.id, verdict)
                        if stray:
                            yield stray

    def _gpu_stray(self, pid: int, used: int | None, gpus: tuple[int, ...]) -> Stray | None:
        """A GPU holder belonging to no live job, whose parent is gone (reparented to init/a subreaper)."""
        try:
            st = self.procfs.stat(pid)
        except (ProcessGone, AccessDenied):
            return None  # exited, or in another pid namespace
        if st.state in ("Z", "X") or pid in self._live_marked or self._in_live_run(st):
            return None
        if not self._holds_a_gpu(pid):
            return None
        adopter = self._adopter(st.ppid)
        if adopter is None:
            return None  # its parent is alive: someone still owns it
        where = ", ".join(str(g) for g in gpus)
        held = f"holds {format_size(used)} on GPU {where}" if used is not None else f"uses GPU {where}"
        reason = f"{held} and belongs to no live job (its parent exited; adopted by {adopter})"
        stray = self._stray(st, reason, None, None)
        return _with_gpu(stray, used, gpus) if stray else None

    # --- helpers ----------------------------------------------------------------------------------

    def _kept_or_started_by_kept(self, run: RunRecord | None, st: ProcStat) -> bool:
        """A process its run kept (--keep-running), or one such a process started since (a server's
        workers): up its parents, within reason."""
        if run is None or not run.kept:
            return False
        for _ in range(64):
            if _kept(run, st.pid, st.start_time):
                return True
            if st.ppid <= 1:
                return False
            try:
                st = self.procfs.stat(st.ppid)
            except (ProcessGone, AccessDenied):
                return False
        return False

    def _may_come_from(self, st: ProcStat, run: RunRecord | None) -> bool:
        """A marker is only an environment variable: anyone can copy it into a new process. A marked
        process is the run's only if it runs as the user who runs the jobs (another user's processes of
        the job, started through sudo, are found by the identity the shim recorded: `_recorded`) and
        started before the run ended."""
        try:
            if self.procfs.uid(st.pid) != os.geteuid():
                return False
        except ProcessGone:
            return False
        started = self._started_at(st)
        if started is None or run is None or run.ended_at is None:
            return True
        return started <= run.ended_at + _START_SLACK_S

    def _started_by_the_job(self, st: ProcStat, job_id: int, depth: int = 0) -> bool:
        """A marked process is the job's only if the job started it: its parent is gone (it was adopted
        by init or a subreaper), or is itself the job's (marked with the same job, or recorded by its
        shim). A live parent outside the job (a user's shell, a service) started it with copied
        variables, perhaps long after the job ended: never the job's leftover, never ended for it."""
        if st.ppid <= 1 or self._adopter(st.ppid) is not None:
            return True
        try:
            parent = self.procfs.stat(st.ppid)
        except ProcessGone:
            return True  # gone since: adopted now
        except AccessDenied:
            return False
        if (parent.pid, parent.start_time) in self._recorded_idents(job_id):
            return True
        try:
            marks = read_job_marks(self.procfs, parent.pid)
        except (ProcessGone, AccessDenied):
            return False
        same_job = marks is not None and self._is_our_home(marks.home) and marks.job_id == job_id
        return same_job and depth < 64 and self._started_by_the_job(parent, job_id, depth + 1)

    def _recorded_idents(self, job_id: int) -> set[tuple[int, int]]:
        """(pid, start time) of every process the shims of this job recorded, of all its runs."""
        if job_id not in self._recorded_by_job:
            idents: set[tuple[int, int]] = set()
            with contextlib.suppress(JobNotFound):
                for run in range(1, self.store.run(job_id).n + 1):
                    idents.update((p.pid, p.start_time) for p in self.store.processes(job_id, run))
            self._recorded_by_job[job_id] = idents
        return self._recorded_by_job[job_id]

    def _is_our_home(self, home: str) -> bool:
        return home in self._homes or os.path.realpath(home) in self._homes

    def _live_stat(self, pid: int, start: int) -> ProcStat | None:
        try:
            st = self.procfs.stat(pid)
        except (ProcessGone, AccessDenied):
            return None
        return st if st.start_time == start and st.state not in ("Z", "X") else None

    def _in_live_run(self, st: ProcStat) -> bool:
        """Recorded by the shim of a live run (a job process whose environment was replaced)."""
        if self._live_idents is None:
            self._live_idents = set()
            for job in self._jobs.values():
                verdict = self._verdict(job.id, None)
                if verdict.reason is None and verdict.run is not None:
                    live = self.store.processes(job.id, verdict.run.n, live_only=True)
                    self._live_idents.update((p.pid, p.start_time) for p in live)
        return (st.pid, st.start_time) in self._live_idents

    def _holds_a_gpu(self, pid: int) -> bool:
        """NVML names pids of the host's pid namespace: inside a container the same number may name an
        unrelated process here. There, only one with an NVIDIA device open is the holder NVML meant.
        Another user's descriptors cannot be read: trust NVML then (ending it needs root, who can)."""
        if self.host_pids:
            return True
        try:
            return self.procfs.has_open_file(pid, "/dev/nvidia")
        except AccessDenied:
            return True
        except ProcessGone:
            return False

    def _adopter(self, ppid: int) -> str | None:
        """'init (pid 1)' or 'systemd (pid 812)' when `ppid` adopts orphans; None for an ordinary parent."""
        if ppid <= 1:
            return "init (pid 1)"
        try:
            comm = self.procfs.stat(ppid).comm
        except (ProcessGone, AccessDenied):
            return None
        return f"{comm} (pid {ppid})" if comm in _ADOPTERS else None

    def _started_at(self, st: ProcStat) -> float | None:
        if self._boot is None:
            try:
                self._boot = self.procfs.boot_time()
            except OSError:
                return None
        return self._boot + st.start_time / self.procfs.ticks_per_s

    def _stray(self, st: ProcStat, reason: str, job_id: int | None, verdict: _Verdict | None) -> Stray | None:
        try:
            command = self.procfs.cmdline(st.pid)
            uid: int | None = self.procfs.uid(st.pid)
        except ProcessGone:
            return None
        run = verdict.run.n if verdict and verdict.run else None
        return Stray(
            pid=st.pid,
            start_time=st.start_time,
            ppid=st.ppid,
            pgid=st.pgid,
            uid=uid,
            user=user_name(uid),
            state=st.state,
            command=command,
            started_at=self._started_at(st),
            rss_bytes=st.rss_pages * self.procfs.page_size,
            reason=reason,
            job=job_id,
            run=run,
            job_name=verdict.job.name if verdict and verdict.job else None,
        )


def _kept(run: RunRecord | None, pid: int, start_time: int) -> bool:
    """Kept past its run's end by --keep-running (or started by a process that was): not a stray."""
    return run is not None and any(
        k.get("pid") == pid and k.get("start_time") == start_time for k in run.kept
    )


def _gpu_usage(processes: Sequence[GpuProcess]) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """pid -> (bytes held on all GPUs, or None when NVML cannot tell; the GPU indexes)."""
    usage: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    for p in processes:
        if "compute" not in p.kind:
            continue  # graphics only: a desktop's Xorg or compositor, never a job's leftover
        used, gpus = usage.get(p.pid, (None, ()))
        if p.used_bytes is not None:
            used = (used or 0) + p.used_bytes
        usage[p.pid] = (used, tuple(sorted({*gpus, p.gpu_index})))
    return usage


def _with_gpu(stray: Stray, used: int | None, gpus: tuple[int, ...]) -> Stray:
    return replace(stray, gpu_memory_bytes=used, gpus=gpus)


def gpu_processes() -> list[GpuProcess]:
    """The GPU holders NVML sees; [] when there is no GPU, no driver, or no GPU probe in this build."""
    try:
        from jobwarden.probes.gpu import open_gpu_probe
    except ImportError:  # pragma: no cover - the probe ships with jobwarden; its binding is optional
        return []
    probe = open_gpu_probe()
    if probe is None:
        return []
    try:
        return probe.processes()
    except JobwardenError:  # NVML could not answer (a driver reload): the markers still find the rest
        return []
    finally:
        probe.close()


def self_and_ancestors(procfs: ProcFS, pid: int | None = None) -> set[int]:
    """This process and every ancestor up to init."""
    found: set[int] = set()
    current = os.getpid() if pid is None else pid
    while current > 1 and current not in found:
        found.add(current)
        try:
            current = procfs.stat(current).ppid
        except (ProcessGone, AccessDenied):
            break
    return found


def find_strays(
    home: Path, procfs: ProcFS, now: float, gpu: Sequence[GpuProcess] | None = None
) -> list[Stray]:
    """Every stray on the machine, against the store of `home`. `gpu`: the GPU holders (None: ask NVML)."""
    holders = gpu_processes() if gpu is None else gpu
    with Store(home) as store:
        finder = StrayFinder(store, procfs, now, self_and_ancestors(procfs), in_initial_pid_namespace())
        return finder.find(holders)


def release_dead_cgroups() -> list[str]:
    """The empty cgroups of supervisors killed before their end (one that ends removes its own)."""
    from jobwarden import trace
    from jobwarden.osapi.cgroup import remove_dead_shims_cgroups

    removed = [str(path) for path in remove_dead_shims_cgroups()]
    for path in removed:
        trace.info(f"removed {path}: the empty cgroup of a supervisor that is dead")
    return removed

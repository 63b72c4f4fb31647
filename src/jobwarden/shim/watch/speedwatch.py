"""Why the running job is slow, watched by its shim: the speed counters read every few seconds, the step
rate cut into stretches every tick, and the speed rules (rules.speed) asked every JUDGE_EVERY_S over the
last WINDOW_S. Findings are recorded through the diagnosis's LiveFindings like any live finding, and
resolved once their rule stayed silent for two judgements running (a flapping finding would notify twice).

Cheap by construction (a 64-process job must cost its shim at most 1 % of a core, scripts/bench-speed):
- every tick: nothing but the tree's own stat lines (already read) and the progress the watch computed;
- every READ_EVERY_S: one read of /proc/PID/schedstat per member, three PSI files, one cgroup cpu.stat;
- only when the run queue delay says the job waits: its threads' states (oversubscription), and a scan
  of /proc for the processes that use its CPUs (contention), at most every judgement.
All counters are cumulative, so a process read less often loses nothing but resolution.

JOBWARDEN_SPEED=off turns it off (the benchmark's baseline).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import Finding, ProcessId, ProcessSnapshot
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.osapi.cpuquota import CpuCgroup, CpuStat, cpu_cgroup_of
from jobwarden.osapi.procfs import ProcFS, TaskCounters, parse_stat_counters
from jobwarden.osapi.users import user_name
from jobwarden.paths import HOME_ENV, JOB_ID_ENV
from jobwarden.rules.speed import SPEED_RULES, judge
from jobwarden.rules.speed.cpu import THROTTLED_SHARE, WAIT_SHARE, cpu_oversubscribed
from jobwarden.rules.speed.evidence import (
    GpuClock,
    GpuShare,
    Neighbour,
    SpeedEvidence,
    StepMove,
    ThreadsRead,
    ThreadUse,
    WorkerBatch,
)
from jobwarden.rules.speed.loading import LOADER_WORKER_COMM, worth_sampling
from jobwarden.rules.speed.stalls import STALL_MIN_S, stall_after, usual_gap
from jobwarden.rules.speed.threads import STARTUP_S, command_key, worker_kind
from jobwarden.shim.record.findings import Key, LiveFindings, key_of
from jobwarden.shim.watch.rankwatch import RankHints, RankWatch, ranks_on_gpus
from jobwarden.shim.watch.stacksample import StackSampler
from jobwarden.shim.watch.stepsegments import Segments

if TYPE_CHECKING:
    from jobwarden.shim.tree.jobtree import Member
    from jobwarden.shim.watch.gpuwatch import GpuWatch

SPEED_ENV = "JOBWARDEN_SPEED"
READ_EVERY_S = 2.0
JUDGE_EVERY_S = 4.0
WINDOW_S = 20.0
MIN_WINDOW_S = 8.0  # the first judgement waits for this much of a window: a start-up is no verdict
CGROUP_EVERY_S = 30.0  # the job's cpu cgroup (and its quota) looked up again
SCAN_EVERY_S = 8.0  # /proc scanned for the job's neighbours at most this often
RESOLVE_AFTER = 2  # judgements in a row a finding's rule must stay silent before it is resolved
CUDA_LIBS = (b"libcuda.so", b"libcudart", b"libtorch_cuda")
THREADS_CPU = 50.0  # % of a core a process must use before its threads are read (gil-bound); not 90: on a
# loaded machine a GIL-bound process gets less than its one core (measured 0.58 at load 6 on 2 cores)
THREADS_PROCESSES = 4  # the busiest processes whose threads are read at one read, at most
# Workers of one parent started this close together, while a worker of the batch is still there, are
# one batch. By their start times, not when the tree first saw them: a worker seen seconds late made an
# epoch's 2 workers read as batches of 1 and 4. A DataLoader starts an epoch's workers back to back, but
# a spawned worker's start waits until the worker before it has read its pickled dataset, which it does
# as it imports: 1-2 s apart on a loaded machine (4 batches of 1 in a CI-like run at 0.5 s). The next
# epoch's workers start once this epoch's have ended: never one batch with them, however soon.
BATCH_S = 3.0
BATCHES_KEPT = 64


def speed_enabled() -> bool:
    return os.environ.get(SPEED_ENV, "on") != "off"


class _Read(NamedTuple):
    mono: float
    per_pid: dict[ProcessId, tuple[int, int, int, int]]  # exec ns, run delay ns, slices, major faults
    cpu: CpuStat | None
    io_us: int | None
    mem_some_us: int | None
    mem_full_us: int | None
    threads: int
    refaults: int | None


class SpeedWatch:
    def __init__(
        self,
        procfs: ProcFS,
        live: LiveFindings,
        gpus_claimed: Sequence[int] = (),
        shim_pid: int | None = None,
        memory_cgroup: JobCgroup | None = None,
        py_dir: Path | None = None,
    ) -> None:
        """`py_dir`: where the job's Python hooks serve each rank's flight recorder (RankWatch)."""
        self.procfs, self.live = procfs, live
        self.memory_cgroup = memory_cgroup  # the job's own (jobwarden's): its refaults are the job's
        self.gpus_claimed = tuple(gpus_claimed)
        self.shim_pid = shim_pid if shim_pid is not None else os.getpid()
        self.segments = Segments()
        self.reads: deque[_Read] = deque()
        self.main_pid: int | None = None
        self.unit = "it"
        self._next_read = 0.0
        self._next_judge = 0.0
        self._cgroup: CpuCgroup | None = None
        self._cgroup_at = -CGROUP_EVERY_S
        self._affinity: frozenset[int] = frozenset()
        self._ticks = 0
        self._dstate_ticks: deque[tuple[float, bool]] = deque()
        self._outside: dict[ProcessId, int] | None = None  # CPU ticks of other processes at the last scan
        self._outside_at = 0.0
        self._named: list[Neighbour] = []  # who used the job's CPUs, as the last scan found
        self._silent: dict[str, int] = {}
        self._silent_keys: dict[Key, int] = {}  # judgements each finding (rule and pids) went unnamed
        self._gpu_busy_since: float | None = None
        self._cuda: tuple[int, bool] | None = None  # (main pid, mapped)
        self._users: dict[int, str] = {}
        self._seen: dict[ProcessId, tuple[bytes, tuple[int, int, int, int], int]] = {}  # at the last read
        self._tasks: dict[ProcessId, tuple[float, dict[int, TaskCounters]]] = {}
        self._thread_reads: deque[tuple[float, ThreadsRead]] = deque()
        self._kids: dict[ProcessId, tuple[int, float, float]] = {}  # worker: (batch, first seen, startup CPU)
        self._batches: deque[tuple[int, WorkerBatch]] = deque(maxlen=BATCHES_KEPT)  # (number, batch)
        self._batch_no = 0
        self._not_workers: set[ProcessId] = set()
        self.stacks = StackSampler(procfs)  # the loop's stack now and then, and in each stall
        # where each rank's main thread is, and its recorder's waits (straggler, `status`'s ranks)
        self.ranks = RankWatch(procfs, py_dir=py_dir)
        self._usual: tuple[StepMove, float | None] | None = None  # (the last move, the usual gap then)
        self.judged: SpeedEvidence | None = None  # the last judgement's evidence, until taken

    # --- each tick ------------------------------------------------------------------------------------

    def tick(
        self,
        now: float,
        mono: float,
        members: Iterable[Member],
        snaps: Sequence[ProcessSnapshot],
        step: int | None,
        unit: str | None = None,
        gpu: GpuWatch | None = None,
        ranks: RankHints | None = None,
    ) -> tuple[list[Finding], list[Finding]]:
        """Cheap every tick; reads every READ_EVERY_S; judges every JUDGE_EVERY_S. (new, resolved).
        `ranks`: what the progress sources say of each rank (its steps, its rank where no variable
        names it)."""
        self.segments.observe(mono, now, step)
        if unit:
            self.unit = unit
        self._dstate_ticks.append((mono, any(s.state == "D" for s in snaps)))
        while self._dstate_ticks and self._dstate_ticks[0][0] < mono - WINDOW_S:
            self._dstate_ticks.popleft()
        members = list(members)
        self._note_workers(mono, members)
        self.ranks.tick(mono, members, ranks)
        if mono >= self._next_read:
            self._next_read = mono + READ_EVERY_S
            self._read(mono, members)
        self._note_gpu(mono, snaps, gpu)
        self.stacks.tick(mono, members, snaps, self._stalled(mono))
        if mono < self._next_judge or len(self.reads) < 2 or self._window() < MIN_WINDOW_S:
            return [], []
        self._next_judge = mono + JUDGE_EVERY_S
        ev = self.judged = self.evidence(mono, members, gpu)
        self.stacks.suspect(mono, worth_sampling(ev))
        return self._record(judge(ev), now)

    def _stalled(self, mono: float) -> float | None:
        """The moment of the counter's last move when it has stood still as long as a stall since
        (rules.speed.stalls' measure), else None. A comparison a tick; the median of the gaps only once a
        stall is possible, and once per last move."""
        moves = self.segments.moves
        if not moves or mono - moves[-1].at < STALL_MIN_S:
            return None
        last = moves[-1]
        if self._usual is None or self._usual[0] is not last:
            self._usual = (last, usual_gap(moves))
        usual = self._usual[1]
        return last.at if usual is not None and mono - last.at >= stall_after(usual) else None

    def _window(self) -> float:
        return self.reads[-1].mono - self.reads[0].mono

    def _read(self, mono: float, members: list[Member]) -> None:
        if mono - self._cgroup_at >= CGROUP_EVERY_S and self.main_pid is not None:
            self._cgroup_at = mono
            self._cgroup = cpu_cgroup_of(self.main_pid, str(self.procfs.root))
            with contextlib.suppress(ProcessGone):
                self._affinity = self.procfs.affinity(self.main_pid)
        per_pid: dict[ProcessId, tuple[int, int, int, int]] = {}
        seen: dict[ProcessId, tuple[bytes, tuple[int, int, int, int], int]] = {}
        threads = 0
        for m in members:
            before = self._seen.get(m.ident)
            state = m.snapshot.state if m.snapshot else "R"
            if before is not None and before[0] is m.raw_stat and state not in ("R", "D"):
                # the same stat line, asleep: it did not run (nor wait to run) since: nothing to read
                seen[m.ident] = before
                per_pid[m.ident], threads = before[1], threads + before[2]
                continue
            try:
                sched = self.procfs.schedstat(m.pid)
            except (ProcessGone, AccessDenied):
                continue
            if sched is None:
                continue
            majflt = nthreads = 0
            if m.raw_stat:
                with contextlib.suppress(ValueError, IndexError):
                    counters = parse_stat_counters(m.raw_stat.decode("ascii", "replace"))
                    majflt, nthreads = counters.majflt, counters.num_threads
            values = (sched.exec_ns, sched.run_delay_ns, sched.timeslices, majflt)
            per_pid[m.ident], threads = values, threads + nthreads
            seen[m.ident] = (m.raw_stat, values, nthreads)
        self._seen = seen
        self._read_threads(mono, members, seen)
        self.ranks.read(mono)
        cg = self._cgroup
        io = (cg.pressure("io") if cg else None) or self.procfs.pressure("io")
        mem = (cg.pressure("memory") if cg else None) or self.procfs.pressure("memory")
        self.reads.append(
            _Read(
                mono,
                per_pid,
                cg.cpu_stat() if cg else None,
                io.some_us if io else None,
                mem.some_us if mem else None,
                mem.full_us if mem else None,
                threads,
                self.memory_cgroup.refaults() if self.memory_cgroup else None,
            )
        )
        while len(self.reads) > 2 and self.reads[1].mono <= mono - WINDOW_S:
            self.reads.popleft()

    # --- the job's own workers and threads (worker-respawn, gil-bound) --------------------------------

    def _note_workers(self, mono: float, members: list[Member]) -> None:
        """Python workers (rules.speed.threads.worker_kind) by the batch their parent started them in, and
        the CPU each used in its first STARTUP_S. Every tick, from the tree's members alone: a new member
        is classified once."""
        present = {m.ident for m in members}
        by_pid = {m.pid: m for m in members}
        live = {no for ident, (no, _, _) in self._kids.items() if ident in present}  # batches still at work
        for m in members:
            if m.ident in self._not_workers:
                continue
            kid = self._kids.get(m.ident)
            if kid is not None:
                if mono - kid[1] <= STARTUP_S and m.last_ticks is not None:
                    self._kids[m.ident] = (kid[0], kid[1], m.last_ticks / self.procfs.ticks_per_s)
                continue
            parent = by_pid.get(m.ppid)
            kind = worker_kind(m.cmdline, parent.cmdline) if parent is not None else None
            if kind is None:
                self._not_workers.add(m.ident)
                continue
            started_s = m.ident.start_time / self.procfs.ticks_per_s
            no = self._join_batch(mono, started_s, m.ppid, command_key(m.cmdline), kind, live)
            live.add(no)
            self._kids[m.ident] = (no, mono, 0.0)
        self._not_workers &= present  # bounded by the tree
        gone = {ident for ident in self._kids if ident not in present}
        if not self._kids:
            return
        by_batch: dict[int, list[tuple[bool, float]]] = {}  # batch: (gone, start-up CPU) of each worker
        for ident, (no, _, startup) in self._kids.items():
            by_batch.setdefault(no, []).append((ident in gone, startup))
        for i, (no, b) in enumerate(self._batches):
            kids = by_batch.get(no)
            if not kids:
                continue
            startup = max(b.startup_cpu_s, *(k[1] for k in kids))
            ended = mono if b.ended_at is None and all(k[0] for k in kids) else b.ended_at
            if startup != b.startup_cpu_s or ended != b.ended_at:
                self._batches[i] = (no, replace(b, startup_cpu_s=startup, ended_at=ended))
        for ident in gone:
            del self._kids[ident]

    def _join_batch(
        self, mono: float, started_s: float, parent: int, command: str, kind: str, live: set[int]
    ) -> int:
        """The batch of a worker first seen now, `started_s` seconds after boot: one of the same parent
        and command whose first worker started within BATCH_S of it, a worker of which is still there
        (`live`): an epoch's workers replaced by the next epoch's are two batches, never one of four."""
        for i, (no, b) in enumerate(self._batches):
            same = b.parent_pid == parent and b.command == command and no in live
            if same and abs(started_s - b.started_s) <= BATCH_S:
                self._batches[i] = (no, replace(b, count=b.count + 1))
                return no
        self._batch_no += 1
        self._batches.append(
            (self._batch_no, WorkerBatch(parent, command, kind, mono, 1, started_s=started_s))
        )
        return self._batch_no

    def _read_threads(
        self,
        mono: float,
        members: list[Member],
        seen: dict[ProcessId, tuple[bytes, tuple[int, int, int, int], int]],
    ) -> None:
        """Per-thread CPU and run delay of the processes that use about a core with two threads or more:
        only those can be GIL-bound, so the shim reads no task files of anything else."""
        tasks: dict[ProcessId, tuple[float, dict[int, TaskCounters]]] = {}
        busy = [
            m
            for m in members
            if m.snapshot
            and (m.snapshot.cpu_percent or 0.0) >= THREADS_CPU
            and m.ident in seen
            and seen[m.ident][2] >= 2
        ]
        busy.sort(key=lambda m: -(m.snapshot.cpu_percent or 0.0) if m.snapshot else 0.0)
        for m in busy[:THREADS_PROCESSES]:
            try:
                now = self.procfs.task_counters(m.pid)
            except (ProcessGone, AccessDenied):
                continue
            tasks[m.ident] = (mono, now)
            before = self._tasks.get(m.ident)
            if before is None or mono <= before[0]:
                continue
            seconds = mono - before[0]
            used = []
            for tid, c in now.items():
                b = before[1].get(tid, TaskCounters(0, 0, 0))
                if c.exec_ns > b.exec_ns:
                    used.append(
                        ThreadUse(
                            (c.exec_ns - b.exec_ns) / 1e9 / seconds,
                            max(c.run_delay_ns - b.run_delay_ns, 0) / 1e9 / seconds,
                            max(c.voluntary_switches - b.voluntary_switches, 0) / seconds,
                        )
                    )
            used.sort(key=lambda t: -t.cpu)
            self._thread_reads.append((mono, ThreadsRead(m.pid, seconds, tuple(used[:16]), m.cmdline)))
        self._tasks = tasks  # a process that is no longer busy starts afresh: no stale base
        while self._thread_reads and self._thread_reads[0][0] < mono - WINDOW_S:
            self._thread_reads.popleft()

    # --- the evidence ---------------------------------------------------------------------------------

    def allowance(self) -> tuple[float, int, float | None]:
        """(CPUs the job may use, CPUs of its affinity, its quota in CPUs)."""
        affinity = len(self._affinity) or os.cpu_count() or 1
        quota = self._cgroup.quota_cpus if self._cgroup else None
        return (min(float(affinity), quota) if quota is not None else float(affinity)), affinity, quota

    def evidence(self, mono: float, members: list[Member], gpu: GpuWatch | None = None) -> SpeedEvidence:
        first, last = self.reads[0], self.reads[-1]
        window = last.mono - first.mono
        exec_ns = delay_ns = slices = majflt = 0
        for ident, (e, d, s, f) in last.per_pid.items():
            before = first.per_pid.get(ident, (0, 0, 0, 0))  # born in the window: all of it is new
            exec_ns, delay_ns = exec_ns + e - before[0], delay_ns + d - before[1]
            slices, majflt = slices + s - before[2], majflt + f - before[3]
        throttled_s = periods = throttled = None
        if first.cpu and last.cpu:
            throttled_s = (last.cpu.throttled_ns - first.cpu.throttled_ns) / 1e9
            periods = last.cpu.nr_periods - first.cpu.nr_periods
            throttled = last.cpu.nr_throttled - first.cpu.nr_throttled
        cpus, affinity, quota = self.allowance()
        dticks = [d for _, d in self._dstate_ticks]
        cg_scope = self._cgroup is not None and self._cgroup.pressure_dir is not None
        ev = SpeedEvidence(
            window_s=window,
            cpus=cpus,
            affinity_cpus=affinity,
            quota_cpus=quota,
            cpu_s=exec_ns / 1e9,
            run_delay_s=delay_ns / 1e9,
            timeslices=slices,
            throttled_s=throttled_s,
            periods=periods or 0,
            throttled_periods=throttled or 0,
            processes=len(last.per_pid),
            threads=last.threads,
            dstate_share=sum(dticks) / len(dticks) if dticks else 0.0,
            majflt=majflt,
            io_some_s=_delta_s(first.io_us, last.io_us),
            memory_some_s=_delta_s(first.mem_some_us, last.mem_some_us),
            memory_full_s=_delta_s(first.mem_full_us, last.mem_full_us),
            refault_pages=(
                max(last.refaults - first.refaults, 0)
                if first.refaults is not None and last.refaults is not None
                else None
            ),
            pressure_scope="cgroup" if cg_scope else "machine",
            segments=tuple(self.segments.done),
            moves=tuple(self.segments.moves),
            unit=self.unit,
            main_pid=self.main_pid,
            pids=tuple(m.pid for m in members),
            worker_batches=tuple(b for _, b in self._batches),
            thread_reads=tuple(r for _, r in self._thread_reads),
            ranks=self.ranks.views(first.per_pid, last.per_pid, window),
        )
        if gpu is not None:
            ev = self._with_gpu(ev, mono, gpu)
        ev = self._with_loading(ev, first, last, members)
        throttled_share = ev.throttled_periods / ev.periods if ev.periods else 0.0
        if ev.wait_share >= WAIT_SHARE and throttled_share < THROTTLED_SHARE:
            ev = self._why_waiting(ev, mono, members)
        else:
            self._outside, self._named = None, []  # a scan from long ago is no base for the next one
        return ev

    def _why_waiting(self, ev: SpeedEvidence, mono: float, members: list[Member]) -> SpeedEvidence:
        """The job waits for CPUs: its own runnable threads first (cheap: its own /proc), and only when
        they do not explain it, who else ran on its CPUs (a scan of /proc, at most every SCAN_EVERY_S)."""
        runnable = 0
        if ev.cpu_used >= 0.5 * ev.cpus:
            for m in members:
                with contextlib.suppress(ProcessGone, AccessDenied):
                    runnable += len(self.procfs.threads_in_state(m.pid, "R"))
        ev = replace(ev, runnable_threads=float(runnable))
        if cpu_oversubscribed(ev) is not None:
            self._outside = None
            return ev
        if self._outside is None or mono - self._outside_at >= SCAN_EVERY_S:
            self._named = self._neighbours(mono, members)
        return replace(ev, neighbours=tuple(self._named))

    def _neighbours(self, mono: float, members: list[Member]) -> list[Neighbour]:
        """Processes outside the job that used its CPUs since the previous scan (none at the first)."""
        job = {m.pid for m in members} | {self.shim_pid}
        cpus = self._affinity
        ticks: dict[ProcessId, int] = {}
        last_cpu: dict[ProcessId, int] = {}
        for st in self.procfs.iter_stats():
            if st.pid in job or st.ppid == 2 or st.pid == 2:
                continue
            ident = ProcessId(st.pid, st.start_time)
            ticks[ident] = st.cpu_ticks
            last_cpu[ident] = st.processor
        before, before_at = self._outside, self._outside_at
        self._outside, self._outside_at = ticks, mono
        if before is None or mono <= before_at:
            return []
        seconds = mono - before_at
        found = []
        for ident, t in ticks.items():
            used = (t - before.get(ident, t)) / self.procfs.ticks_per_s / seconds
            if used < 0.05 or (cpus and last_cpu.get(ident, -1) not in cpus):
                continue
            found.append(self._describe(ident.pid, used))
        return sorted(found, key=lambda n: -n.cpu)[:10]

    def _describe(self, pid: int, used: float) -> Neighbour:
        user, job_id, cmdline = "?", None, "?"
        with contextlib.suppress(ProcessGone, AccessDenied):
            uid = self.procfs.uid(pid)
            user = self._users.get(uid) or self._users.setdefault(uid, user_name(uid))
            cmdline = self.procfs.cmdline(pid)
            env = self.procfs.environ_values(pid, (JOB_ID_ENV, HOME_ENV))
            value = env.get(JOB_ID_ENV)
            # a job id means something only in the store it came from: this one's (same user, same home)
            ours = uid == os.getuid() and env.get(HOME_ENV) == os.environ.get(HOME_ENV)
            job_id = int(value) if ours and value and value.isascii() and value.isdigit() else None
        return Neighbour(pid=pid, user=user, cpu=round(used, 2), cmdline=cmdline, job_id=job_id)

    def _with_loading(
        self, ev: SpeedEvidence, first: _Read, last: _Read, members: list[Member]
    ) -> SpeedEvidence:
        """The loop's sampled stacks (and those of the stalls), and the DataLoader's workers (comm
        pt_data_worker, as torch names them) with the CPU they used over the window."""
        workers = [m.ident for m in members if m.comm == LOADER_WORKER_COMM]
        ns = 0
        for ident in workers:
            if ident in last.per_pid:
                ns += last.per_pid[ident][0] - first.per_pid.get(ident, (0, 0, 0, 0))[0]
        return replace(
            ev,
            stack_samples=tuple(self.stacks.samples),
            stack_span_s=self.stacks.span_s(),
            stack_pid=self.stacks.pid,
            stall_samples=tuple(self.stacks.stall_samples),
            stall_sampling=self.stacks.stall_sampling(),
            loader_workers=len(workers),
            loader_worker_cpu=ns / 1e9 / ev.window_s if ev.window_s > 0 else 0.0,
        )

    # --- GPUs -----------------------------------------------------------------------------------------

    def _note_gpu(self, mono: float, snaps: Sequence[ProcessSnapshot], gpu: GpuWatch | None) -> None:
        usage = gpu.usage if gpu else None
        cpu = sum(s.cpu_percent or 0.0 for s in snaps)
        if not self.gpus_claimed or usage is None or usage.total_bytes or cpu < 50.0:
            self._gpu_busy_since = None
        elif self._gpu_busy_since is None:
            self._gpu_busy_since = mono

    def _with_gpu(self, ev: SpeedEvidence, mono: float, gpu: GpuWatch) -> SpeedEvidence:
        usage = gpu.usage
        unused = mono - self._gpu_busy_since if self._gpu_busy_since is not None else 0.0
        cuda = None
        # the loop's process: under a wrapper (`sh -c`, a bash script) the main one maps no library at all
        pid = self.stacks.loop.pid if self.stacks.loop is not None else self.main_pid
        if unused > 0 and pid is not None:
            if self._cuda is None or self._cuda[0] != pid:
                with contextlib.suppress(ProcessGone, AccessDenied):
                    self._cuda = (pid, self.procfs.maps_any(pid, CUDA_LIBS))
            cuda = self._cuda[1] if self._cuda else None
        mine = {p.gpu_index for p in gpu.processes} | set(self.gpus_claimed)
        sharers = []
        for p in getattr(gpu, "others", ()):
            if p.gpu_index in mine and "compute" in p.kind and p.pid != self.shim_pid:
                n = self._describe(p.pid, 0.0)
                sharers.append(GpuShare(p.gpu_index, p.pid, p.used_bytes, n.user, n.job_id, n.cmdline))
        clocks = tuple(
            GpuClock(d.index, d.sm_clock_mhz, d.sm_clock_max_mhz, d.clock_reasons, d.utilization_percent)
            for d in gpu.devices
            if d.index in mine
            and d.sm_clock_mhz is not None
            and d.sm_clock_max_mhz is not None
            and d.clock_reasons is not None
        )
        ranks = ranks_on_gpus(ev.ranks, clocks, gpu.processes)
        self.ranks.note_gpus(ranks)
        return replace(
            ev,
            gpu_clocks=clocks,
            ranks=ranks,
            gpus_claimed=self.gpus_claimed,
            gpu_bytes=usage.total_bytes if usage else None,
            gpu_unused_s=unused,
            cuda_mapped=cuda,
            gpu_sharers=tuple(sharers),
        )

    # --- findings -------------------------------------------------------------------------------------

    def _record(self, found: list[Finding], now: float) -> tuple[list[Finding], list[Finding]]:
        fired = {f.rule for f in found}
        for rule in SPEED_RULES:
            self._silent[rule] = 0 if rule in fired else self._silent.get(rule, 0) + 1
        # a rule that names one of several subjects (straggler: its rank) may go on firing for another:
        # the finding of the first one resolves once it has not been named for as long
        named = {key_of(f) for f in found}
        for key in set(self._silent_keys) | named:
            self._silent_keys[key] = 0 if key in named else self._silent_keys[key] + 1
        new = self.live.record([f for f in found if self.live.is_new(f)], now)
        self.live.refresh(found, now)  # those already current, as last seen ("3.0x" that is now "3.4x")
        resolved = self.live.resolve_where(
            lambda f: (
                f.rule in SPEED_RULES
                and (
                    self._silent.get(f.rule, 0) >= RESOLVE_AFTER
                    or self._silent_keys.get(key_of(f), 0) >= RESOLVE_AFTER
                )
            ),
            now,
        )
        for f in resolved:
            self._silent_keys.pop(key_of(f), None)
        return new, resolved


def _delta_s(before: int | None, after: int | None) -> float | None:
    if before is None or after is None:
        return None
    return max(after - before, 0) / 1e6


def claimed_gpus(gpu_env: dict[str, str]) -> tuple[int, ...]:
    """GPU indexes the shim gave the job (its CUDA_VISIBLE_DEVICES, when given as indexes)."""
    value = gpu_env.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(int(v) for v in value.split(",") if v.strip().isascii() and v.strip().isdigit())

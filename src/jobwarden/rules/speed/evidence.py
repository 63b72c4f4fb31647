"""What the speed rules judge: a window of the job's counters (deltas over the last seconds, already summed
over its processes by the shim) and its step rate history. Plain data: recorded in tests as it is built by
the shim, so every rule is judged on evidence and never touches /proc."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobwarden.observations import Arrival


@dataclass(frozen=True)
class Neighbour:
    """A process outside the job that used the job's CPUs during the window."""

    pid: int
    user: str
    cpu: float  # CPUs it used on average (0.9: most of one)
    cmdline: str
    job_id: int | None = None  # the jobwarden job it belongs to, if any


@dataclass(frozen=True)
class Segment:
    """The step counter over a stretch of time: from `step` at `at` (wall clock), `rate` steps per second."""

    at: float
    step: int
    rate: float
    seconds: float


@dataclass(frozen=True)
class StepMove:
    """The step counter seen at a new value: when (seconds, the shim's monotonic clock) and which, and how
    many times the shim had looked since the previous move and found it still (a pause shorter than a
    stall shows only so: a late look makes a long gap too, but no still look)."""

    at: float
    step: int
    still: int = 0


@dataclass(frozen=True)
class GpuShare:
    """A process outside the job computing on one of the job's GPUs."""

    gpu_index: int
    pid: int
    used_bytes: int | None
    user: str = "?"
    job_id: int | None = None
    cmdline: str = ""


@dataclass(frozen=True)
class GpuClock:
    """One of the job's GPUs as NVML last read it: its SM clock against its most, and why it is lower."""

    gpu_index: int
    sm_mhz: int
    sm_max_mhz: int
    reasons: int  # NVML clock event reasons (nvmlClocksEventReason*)
    utilization: float | None = None


@dataclass(frozen=True)
class WorkerBatch:
    """Children one parent of the job started together with the same command line (numbers aside): a
    batch of Python workers (multiprocessing spawn/forkserver, or forked from a Python parent)."""

    parent_pid: int
    command: str  # the workers' command line, digits blanked (a spawn worker's pipe handle differs)
    kind: str  # "spawn", "forkserver", "fork"
    born_at: float  # the shim's monotonic clock: when the first of them was seen
    count: int
    ended_at: float | None = None  # when the last of them was seen gone; None: some still run
    startup_cpu_s: float = 0.0  # CPU the busiest of them had used in its first seconds (imports, unpickling)
    started_s: float = 0.0  # the first one's start, seconds since boot: the kernel's, exact however late seen


@dataclass(frozen=True)
class ThreadUse:
    """One thread over one read interval."""

    cpu: float  # CPUs it used
    waiting: float  # CPUs' worth of time it was runnable but waited for a CPU (run-queue delay)
    sleeps: float  # voluntary context switches a second: it waited on a lock (the GIL), I/O, a sleep


@dataclass(frozen=True)
class ThreadsRead:
    """One busy multi-threaded process over one read interval (/proc/PID/task/TID deltas)."""

    pid: int
    seconds: float
    threads: tuple[ThreadUse, ...]  # those that ran, busiest first
    cmdline: str = ""


@dataclass(frozen=True)
class StackSample:
    """The main thread of the job's loop process as one py-spy dump saw it: (function, file) per frame,
    innermost first, and each frame's line (0: unknown) in `lines` when the dump gave them. A sample taken
    during a stall of the step counter carries the stall: `stall_at`, the moment (StepMove.at) of the last
    move before it."""

    at: float
    frames: tuple[tuple[str, str], ...]
    lines: tuple[int, ...] = ()
    stall_at: float | None = None

    def line(self, i: int) -> int:
        return self.lines[i] if i < len(self.lines) else 0


@dataclass(frozen=True)
class RecorderWaits:
    """What a rank's flight recorder says of its collectives over the window, against the other ranks'
    on this node (rules.speed.arrivals)."""

    share: float  # of the time between its consecutive collectives, the share it waited for a later rank
    halves: tuple[float, float]  # the same over the older, the newer half of those intervals
    late_ms: float  # on average, how much later than the rank that waited longest it got there
    last: int  # collectives where it was the one the others waited for
    compared: int  # collectives every rank called in the window, one signature each
    timed: bool  # from the device's timings of each collective (NCCL), not from when each was called
    covered_s: float  # the time its intervals span: the polls' glimpses, not the whole window


@dataclass(frozen=True)
class RankView:
    """One rank process of a distributed job over the window: where its main thread was each time the
    shim looked (rules.speed.ranks.WHERE), as shares of those looks, and its own counters, for the
    straggler's why."""

    rank: int
    pid: int
    local_rank: int | None = None
    node: int | None = None
    looks: int = 0  # times its main thread was looked at in the window
    shares: tuple[tuple[str, float], ...] = ()  # (where, share of the looks), largest first
    halves: tuple[float, float] | None = None  # share in a collective in the older, the newer half of them
    where: str = "unknown"  # at the last look
    where_detail: str = ""  # the system call, or the frame a stack sample showed
    step: int | None = None  # its own step counter, where it has a bar of its own (the hooks' record)
    rate: float | None = None  # its steps a second over the window
    cpu_used: float = 0.0  # CPUs it used on average (schedstat)
    wait_share: float = 0.0  # of the time it could run, the share it waited for a CPU (run queue delay)
    quota_cpus: float | None = None  # the quota of its own cpu cgroup, where that differs from the job's
    throttled_share: float | None = None  # of that cgroup's periods in the window, the share throttled
    idle_detail: str = ""  # what its main thread slept in, where it slept (a frame, else the call)
    data_detail: str = ""  # the DataLoader frame it waited in, where a stack sample showed one
    gpu: GpuClock | None = None  # the GPU its process computes on (NVML's process list), as last read
    majflt_per_s: float = 0.0  # its major page faults a second: its memory read back from disk
    recorder: RecorderWaits | None = None  # its collectives' waits, where every rank's recorder answered
    last_call: Arrival | None = None  # the newest collective its recorder named (kept through a hang)
    call_rate: float | None = None  # its collectives a second in that one's group over the window

    def share(self, where: str) -> float:
        return next((s for w, s in self.shares if w == where), 0.0)


@dataclass(frozen=True)
class SpeedEvidence:
    window_s: float  # the seconds the deltas below cover
    cpus: float  # the job's CPU allowance: affinity ∩ quota
    affinity_cpus: int
    quota_cpus: float | None = None
    cpu_s: float = 0.0  # CPU time the job's processes got
    run_delay_s: float = 0.0  # time they were runnable and waited for a CPU (schedstat)
    timeslices: int = 0  # times they were put on a CPU (switches in)
    throttled_s: float | None = None  # wall time the cgroup's quota held the job back; None: no counter
    periods: int = 0
    throttled_periods: int = 0
    processes: int = 0
    threads: int = 0
    runnable_threads: float | None = None  # threads in R when looked at (only when worth reading)
    dstate_share: float = 0.0  # share of readings with a process of the job in D (waiting on storage)
    majflt: int = 0  # major faults over the window
    refault_pages: int | None = None  # pages the job's memory cgroup read back after eviction (None: unknown)
    io_some_s: float | None = None  # the job's cgroup's (else the machine's) I/O pressure, seconds stalled
    memory_some_s: float | None = None
    memory_full_s: float | None = None
    pressure_scope: str = "machine"  # "cgroup" when the pressure figures are the job's own cgroup's
    neighbours: tuple[Neighbour, ...] = ()
    segments: tuple[Segment, ...] = ()  # oldest first
    moves: tuple[StepMove, ...] = ()  # the counter's recent moves, oldest first
    unit: str = "it"
    gpus_claimed: tuple[int, ...] = ()  # GPU indexes given to the job (CUDA_VISIBLE_DEVICES, --gpus)
    gpu_bytes: int | None = None  # GPU memory its processes hold (None: no NVML)
    gpu_unused_s: float = 0.0  # how long it has held none while its CPUs worked
    cuda_mapped: bool | None = None  # a CUDA library in a process's maps (None: not looked)
    gpu_sharers: tuple[GpuShare, ...] = ()
    gpu_clocks: tuple[GpuClock, ...] = ()
    main_pid: int | None = None
    pids: tuple[int, ...] = field(default=())
    stack_samples: tuple[StackSample, ...] = ()  # the main thread's stack now and then, oldest first
    stack_span_s: float = 0.0  # the time the samples cover
    stack_pid: int | None = None  # the process they were taken of (the job's loop: torch loaded, no worker)
    stall_samples: tuple[StackSample, ...] = ()  # one per stall of the step counter, oldest first
    stall_sampling: bool = False  # the shim dumps stalls (py-spy, a Python process): samples may come
    loader_workers: int = 0  # DataLoader worker processes (comm pt_data_worker) in the job
    loader_worker_cpu: float = 0.0  # CPUs they used on average over the window
    worker_batches: tuple[WorkerBatch, ...] = ()  # oldest first (worker-respawn)
    thread_reads: tuple[ThreadsRead, ...] = ()  # busy processes' threads, oldest first (gil-bound)
    ranks: tuple[RankView, ...] = ()  # the rank processes on this node, by rank (straggler)

    @property
    def wants_s(self) -> float:
        """Time the job's threads were runnable: on a CPU or waiting for one."""
        return self.cpu_s + self.run_delay_s

    @property
    def wait_share(self) -> float:
        """Of the time its threads could run, the share they waited for a CPU."""
        return self.run_delay_s / self.wants_s if self.wants_s > 0 else 0.0

    @property
    def cpu_used(self) -> float:
        """CPUs the job used on average over the window."""
        return self.cpu_s / self.window_s if self.window_s > 0 else 0.0

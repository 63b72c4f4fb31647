"""The CPU speed rules: a quota that throttles the job, other processes on its CPUs, and more busy threads
of its own than it has CPUs. All three show as run-queue delay (schedstat: time runnable but not running,
research/slowness.md 5.4: "run_delay ≈ wall − cpu" under throttling and contention alike); the cgroup's
throttling counters and who else ran tell them apart, in that order: a quota first (its counters say so
without doubt), then the job's own threads (they fill its allowance), then the neighbours."""

from __future__ import annotations

from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import Neighbour, SpeedEvidence

THROTTLED_SHARE = 0.10  # of the window's periods throttled: below, a quota costs nothing worth saying
WAIT_SHARE = 0.25  # of the time runnable spent waiting for a CPU: below, scheduling noise
WARN_SHARE = 0.40  # a cost above this share is a warning; below, info
NEIGHBOUR_CPU = 0.2  # a neighbour that used less than this many CPUs is not named
OVERSUBSCRIBED = 1.5  # runnable threads per allowed CPU
# What the job wanted of a CPU (on one, or runnable and waiting) on average over the window: below this, a
# wait is no loss. A loop that sleeps most of its step, or a deadlocked job ("0.0s on a CPU, 0.0s waiting"),
# shows a high share of a tiny demand, and a neighbour costs it nothing.
MIN_DEMAND_CPUS = 0.2


def _severity(share: float) -> str:
    return "warning" if share >= WARN_SHARE else "info"


def _cpus(n: float) -> str:
    return f"{n:.2f}".rstrip("0").rstrip(".") + (" CPU" if abs(n - 1) < 1e-9 else " CPUs")


def _pids(ev: SpeedEvidence) -> tuple[int, ...]:
    return (ev.main_pid,) if ev.main_pid is not None else ev.pids[:1]


def _common(ev: SpeedEvidence) -> list[str]:
    return [
        f"over {ev.window_s:.0f}s: {ev.cpu_s:.1f}s on a CPU, {ev.run_delay_s:.1f}s runnable but waiting "
        f"(run queue delay, /proc/PID/schedstat), {ev.timeslices} switches onto a CPU, across "
        f"{ev.processes} processes, {ev.threads} threads",
        f"allowance {_cpus(ev.cpus)} (affinity {ev.affinity_cpus}"
        + (f", quota {_cpus(ev.quota_cpus)})" if ev.quota_cpus is not None else ", no quota)"),
    ]


def cpu_throttled(ev: SpeedEvidence) -> Finding | None:
    if ev.throttled_s is None or ev.periods <= 0 or ev.quota_cpus is None:
        return None
    periods = ev.throttled_periods / ev.periods
    if periods < THROTTLED_SHARE:
        return None
    # the share of wall time some of its threads were held back; the run delay shows what it cost them
    held = min(ev.throttled_s / ev.window_s, 1.0) if ev.window_s > 0 else 0.0
    cost = max(held, ev.wait_share)
    quota = _cpus(ev.quota_cpus)
    evidence = [
        f"cgroup cpu.stat: {ev.throttled_periods} of {ev.periods} periods throttled, "
        f"{ev.throttled_s:.1f}s throttled in {ev.window_s:.0f}s",
        *_common(ev),
        f"the job used {ev.cpu_used:.2f} CPUs on average against a quota of {quota}",
    ]
    threads = max(1, int(ev.quota_cpus))
    return Finding(
        "cpu-throttled",
        f"CPU quota of {quota} throttles the job: held back in {100 * periods:.0f}% of its periods",
        f"The job's cgroup may use {quota}; it asked for more, and its threads were held back in "
        f"{100 * periods:.0f}% of the quota periods, waiting {100 * ev.wait_share:.0f}% of the time they "
        "could have run.",
        _severity(cost),
        tuple(evidence),
        f"Raise the quota (the container's --cpus, the pod's CPU limit, Slurm's --cpus-per-task, cgroup "
        f"cpu.max) or make the job fit it: OMP_NUM_THREADS={threads} / torch.set_num_threads({threads}) and "
        "fewer DataLoader workers (torch and the DataLoader size their pools by the cores they see, not "
        "by the quota).",
        _pids(ev),
    )


def _loses_to_waiting(ev: SpeedEvidence) -> bool:
    """Its threads wait for a CPU a large share of a demand worth the name."""
    demand = ev.wants_s / ev.window_s if ev.window_s > 0 else 0.0
    return ev.wait_share >= WAIT_SHARE and demand >= MIN_DEMAND_CPUS


def cpu_oversubscribed(ev: SpeedEvidence) -> Finding | None:
    if not _loses_to_waiting(ev) or ev.runnable_threads is None or ev.cpus <= 0:
        return None
    if ev.runnable_threads < OVERSUBSCRIBED * ev.cpus or ev.runnable_threads < ev.cpus + 1:
        return None
    if ev.cpu_used < 0.5 * ev.cpus:  # it does not fill its CPUs: someone else does (contention)
        return None
    per = max(1, int(ev.cpus // max(ev.processes, 1)))
    return Finding(
        "cpu-oversubscribed",
        f"{ev.runnable_threads:.0f} busy threads on {_cpus(ev.cpus)}: "
        f"waiting {100 * ev.wait_share:.0f}% of the time",
        f"The job keeps {ev.runnable_threads:.0f} threads runnable on {_cpus(ev.cpus)}; they take turns, "
        f"and spend {100 * ev.wait_share:.0f}% of the time they could run waiting for a CPU. Thread pools "
        "that spin (OpenMP, MKL) lose far more than the share: 4-15x lower matmul throughput measured on "
        "2 cores.",
        _severity(ev.wait_share),
        tuple([f"{ev.runnable_threads:.0f} threads runnable when looked at", *_common(ev)]),
        f"Give each process fewer threads: OMP_NUM_THREADS={per} (and MKL_NUM_THREADS), "
        f"torch.set_num_threads({per}); fewer processes or DataLoader workers than CPUs; or give the job "
        "more CPUs.",
        _pids(ev),
    )


def _neighbour(n: Neighbour) -> str:
    job = f", jobwarden job {n.job_id}" if n.job_id is not None else ""
    return f"pid {n.pid} ({n.user}{job}) used {n.cpu:.2f} CPUs: {n.cmdline[:80]}"


def cpu_contention(ev: SpeedEvidence) -> Finding | None:
    if not _loses_to_waiting(ev):
        return None
    named = [n for n in ev.neighbours if n.cpu >= NEIGHBOUR_CPU]
    if not named:
        return None
    named.sort(key=lambda n: -n.cpu)
    top = named[0]
    job = f", job {top.job_id}" if top.job_id is not None else ""
    others = f" and {len(named) - 1} more" if len(named) > 1 else ""
    return Finding(
        "cpu-contention",
        f"other processes take the job's CPUs: pid {top.pid} ({top.user}{job}){others}; "
        f"waiting {100 * ev.wait_share:.0f}% of the time",
        f"Processes outside the job run on the CPUs it may use; its threads waited for a CPU "
        f"{100 * ev.wait_share:.0f}% of the time they could have run, which costs about that share of "
        "its throughput.",
        _severity(ev.wait_share),
        tuple([*(_neighbour(n) for n in named[:5]), *_common(ev)]),
        "Run the job on CPUs nobody else uses (taskset / a cpuset, Slurm --exclusive or a CPU binding), "
        "move or stop the other processes (their owner is named), or lower their priority (renice).",
        _pids(ev),
    )

"""Ranks of a distributed job: where each rank's main thread is, and `straggler`, the rank the others wait
for (DESIGN.md "Ranks").

Ranks that synchronise in every collective run at the speed of the slowest: their step counts stay equal,
so a straggler shows not in its steps but in where the time goes: it computes (or sleeps, or waits on its
data, or on a CPU its quota denies it) while the others sit in their all_reduce waiting for it
(research/ranks.md 3). With the others waiting a share w of their step, the straggler's step is about
1 / (1 - w) times theirs, and w is the share of the job's time lost to it.

Where a main thread is comes from what the shim reads each tick, cheapest first: its state (R: computing,
D: I/O) and the system call it is blocked in (a sleep: idle; a futex or poll wait: in a rank with no
DataLoader workers, its collective: gloo's main thread waits on its work's condition variable, measured
here at 100 % of the looks of a rank waiting for a slower peer); a stack sample of that rank, where one was
taken, names the frame (torch.distributed's collectives, the DataLoader).

Where every rank's flight recorder told when it called its collectives (rules.speed.arrivals), that says
who the others wait for: a straggler whose main thread waits on work of its own (its GPU's stream, a thread
of its own) looks blocked like the others. How long they wait is the recorder's measure too, but never
more than the looks found them blocked (`_recorded_wait`: a call that does not block its caller). Where
the polls' answers span too short a time (MIN_COVERED_S), a rank late in them needs a why from the window.
Where the recorders name nobody, the looks may: a call time says nothing of a rank slow inside the
collective itself (its own part of the exchange starved by its quota: measured beside a CPU hog).

Where the looks decide, a rank found computing more is one only if its main thread also ran longer
than the others' (schedstat, RAN_APART): a look says "computing" of a thread runnable and waiting for a CPU
too, and with steps of a millisecond where a look falls in a step is noise."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jobwarden.model import Finding
from jobwarden.rules.speed import averages
from jobwarden.rules.speed import gpu as gpu_rules
from jobwarden.rules.speed.evidence import RankView, RecorderWaits, SpeedEvidence, StackSample
from jobwarden.rules.speed.storage import MAJFLT_PER_S

WHERE = ("computing", "collective", "data", "io", "idle", "unknown")

# System calls by name (their numbers differ by architecture: osapi.syscalls.NAMES)
_SLEEPS = frozenset({"nanosleep", "clock_nanosleep"})
_WAITS = frozenset(
    {
        "futex",
        "futex_waitv",
        "poll",
        "ppoll",
        "select",
        "pselect6",
        "epoll_wait",
        "epoll_pwait",
        "epoll_pwait2",
        "recvfrom",
        "recvmsg",
        "accept",
        "accept4",
    }
)
_READS = frozenset({"read", "pread64", "readv", "preadv", "preadv2", "openat", "fsync", "fdatasync", "write"})

_PY_COLLECTIVE = "torch/distributed/distributed_c10d.py"  # as rules.hang.collective
_NATIVE_COLLECTIVE = ("c10d::", "ProcessGroupNCCL", "ProcessGroupGloo", "nccl", "gloo::")
_PY_DATA = "torch/utils/data/"

COLLECTIVE_SHARE = 0.20  # the others' median share of looks in a collective: below, nobody waits much
SUSPECT_OF = 0.5  # a straggler's own share is at most this much of the others' median
SLOWER = 1.3  # DESIGN: at least this many times slower per step than the others
MIN_LOOKS = 12  # looks at each rank in the window (one a tick): fewer are a blip (a start-up)
WHY_SHARE = 0.20  # a share of a straggler's looks (sleeping, its data, I/O) worth naming as its why
THROTTLED = 0.10  # of its own cgroup's periods throttled: its quota holds it back
WAIT_SHARE = 0.25  # of its runnable time waiting for a CPU (as rules.speed.cpu)
FAULTS_APART = 4.0  # its major faults a second at least this many times the others' (and 1/s)
GPU_APART = 0.10  # its GPU's share of its clock this much below the others' median: its own why
# a rank the looks find computing ran its main thread at least this many times the others' median
# (schedstat): a 1.3x straggler that computes runs ~1.3x theirs
RAN_APART = 1.15
# the time a straggler's recorder intervals must span for them alone to name it: with steps of half a
# millisecond a poll's 256 collectives span an eighth of a second, and in such a glimpse a rank descheduled
# a few time slices (another process on its core) made the others wait a third of it. Shorter, it needs a
# why from the whole window (its quota, a CPU wait, its looks computing, ...)
MIN_COVERED_S = 2.0
WORK_OF_ITS_OWN = "waits on work of its own"  # the why the recorders alone give
WARN_SHARE = 0.40  # the job's time lost above this: a warning; below, info
MOST_TIMES = (
    20.0  # the others in their collectives 95 % of the looks or more: the factor is no longer measured
)


def where_of(state: str, syscall: str | None, has_loader: bool) -> tuple[str, str]:
    """Where a rank's main thread is, from its state and the call it is blocked in: (where, detail)."""
    if state == "R" or syscall == "running":  # "running": it woke between the two reads
        return "computing", "running or runnable"
    if state == "D":
        return "io", f"uninterruptible wait{f' in {syscall}' if syscall else ''}"
    if syscall in _SLEEPS:
        return "idle", syscall
    if syscall in _WAITS:
        # a rank that has DataLoader workers may be waiting on them as well as on its peers
        return ("unknown" if has_loader else "collective"), f"{syscall} wait"
    if syscall in _READS:
        return "io", syscall
    return "unknown", syscall or ""


def stack_where(sample: StackSample) -> tuple[str, str] | None:
    """What a stack sample of a blocked main thread says it waits in: a collective or the DataLoader,
    with the frame; None when it shows neither."""
    for function, file in sample.frames:  # innermost first
        if _PY_COLLECTIVE in file or any(m in function for m in _NATIVE_COLLECTIVE):
            return "collective", function
        if _PY_DATA in file:
            return "data", function
    return None


def straggler(ev: SpeedEvidence) -> Finding | None:
    ranks = [r for r in ev.ranks if r.looks >= MIN_LOOKS]
    if len(ranks) < 2:
        return None
    if all(r.recorder is not None for r in ranks):
        found = _judged(ranks, ev, recorded=True)
        if found is not None:
            return found
    return _judged(ranks, ev, recorded=False)


def _judged(ranks: Sequence[RankView], ev: SpeedEvidence, recorded: bool) -> Finding | None:
    """The straggler by the recorders' waits, or by the looks'."""
    waited = _recorded_wait if recorded else _looked_wait
    suspects = [r for r in ranks if _lags(r, [o for o in ranks if o is not r], waited)]
    if not suspects or (len(ranks) > 2 and 2 * len(suspects) >= len(ranks)):  # a few, not half the job
        return None
    others = [r for r in ranks if r not in suspects]
    waiting = averages.median(waited(r)[0] for r in others)
    slower = 1 / max(1 - waiting, 1 / MOST_TIMES)
    times = f"more than {MOST_TIMES:.0f}×" if slower >= MOST_TIMES else f"about {_factor(slower)}×"
    if slower < SLOWER:
        return None
    slow = min(suspects, key=lambda r: waited(r)[0])
    why = _why(slow, others, ev, recorded)
    if not recorded and not why and slow.share("computing") >= WHY_SHARE:
        # found computing, yet its main thread ran no longer than theirs: the looks caught it runnable
        # (a loaded machine), or their own noise (steps of a millisecond), not doing more work
        return None
    if recorded and _glimpsed(slow) and (not why or WORK_OF_ITS_OWN in why[0]):
        return None  # late in the polls' glimpses, and nothing over the window says why
    names = ", ".join(str(r.rank) for r in sorted(suspects, key=lambda r: r.rank) if r is not slow)
    also = f" (and rank{'s' if len(suspects) > 2 else ''} {names})" if len(suspects) > 1 else ""
    evidence = [
        *(_recorder_line(r, r.recorder) for r in sorted(ranks, key=lambda r: r.rank) if r.recorder),
        *(_share_line(r) for r in sorted(ranks, key=lambda r: r.rank)),
        *why,
    ]
    return Finding(
        "straggler",
        f"Rank {slow.rank} is a straggler: {times} slower per step than the others{also}",
        f"The other ranks spend {100 * waiting:.0f}% of their time in their collectives waiting for rank "
        f"{slow.rank}, which spends {100 * waited(slow)[0]:.0f}% there"
        + (" (their flight recorders)" if recorded else "")
        + f": its step takes {times} theirs, and the job loses about {100 * waiting:.0f}% of its time to it."
        + (f" Why: {why[0]}." if why else ""),
        "warning" if waiting >= WARN_SHARE else "info",
        tuple(evidence),
        _remedy(slow, why),
        (slow.pid, *(r.pid for r in sorted(suspects, key=lambda r: r.rank) if r is not slow)),
        slow.rank,
    )


Waited = Callable[[RankView], tuple[float, tuple[float, float] | None]]


def _looked_wait(r: RankView) -> tuple[float, tuple[float, float] | None]:
    """Its share of the looks in a collective, over the window and its halves."""
    return r.share("collective"), r.halves


def _recorded_wait(r: RankView) -> tuple[float, tuple[float, float] | None]:
    """Its share of the time waiting in its collectives, as the recorders tell it: from the call times, at
    most the share of looks that found its main thread blocked in a wait. A wait measured from the call
    times assumes that each call blocks its caller until the last rank calls; an asynchronous one does not
    (DDP's buckets, NCCL's every collective): a rank a millisecond later at each of 25 buckets of a step
    is not 25 ms of the others' time waiting. The device's timings measure the device's own waits."""
    w = r.recorder
    assert w is not None
    if w.timed:
        return w.share, w.halves
    blocked = r.share("collective")
    looked = r.halves or (blocked, blocked)
    return min(w.share, blocked), (min(w.halves[0], looked[0]), min(w.halves[1], looked[1]))


def _lags(rank: RankView, others: Sequence[RankView], waited: Waited) -> bool:
    """Far less in its collectives than the others are, over the window and in each half of it (where
    the shim split it): a start-up where one rank waits for another to import torch is a blip."""
    share, mine = waited(rank)
    if not _lags_in(share, [waited(o)[0] for o in others]):
        return False
    halves = [h for o in others if (h := waited(o)[1]) is not None]
    if mine is None or len(halves) < len(others):
        return True  # not split: the window alone
    return all(_lags_in(mine[i], [h[i] for h in halves]) for i in (0, 1))


def _lags_in(share: float, others: Sequence[float]) -> bool:
    median = averages.median(others)
    return median >= COLLECTIVE_SHARE and share <= SUSPECT_OF * median


def _recorder_line(r: RankView, w: RecorderWaits) -> str:
    how = "the device's timings of its collectives" if w.timed else "when it called its collectives"
    return (
        f"rank {r.rank} (pid {r.pid}), its flight recorder ({how}): waited for a later rank "
        f"{100 * w.share:.0f}% of the time; the one waited for in {w.last} of {w.compared} collectives, "
        f"{w.late_ms:.1f} ms after the earliest on average"
    )


def _share_line(r: RankView) -> str:
    rest = ", ".join(f"{w} {100 * s:.0f}%" for w, s in r.shares if w != "collective" and s >= 0.05)
    return (
        f"rank {r.rank} (pid {r.pid}): in collectives {100 * r.share('collective'):.0f}% of {r.looks} looks"
        + (f"; {rest}" if rest else "")
    )


def _why(r: RankView, others: Sequence[RankView], ev: SpeedEvidence, recorded: bool) -> list[str]:
    """What that rank's own counters show holds it back, strongest first: its own quota, then by the
    share of its time each took. Only what sets it apart: a wait for a CPU that every rank shares (a
    loaded machine) is not its why. `recorded`: the recorders named it, so a main thread blocked like the
    others' waits on work of its own."""
    found: list[tuple[float, str]] = []
    if r.quota_cpus is not None and (r.throttled_share or 0.0) >= THROTTLED:
        found.append(
            (
                2.0,
                f"its cpu cgroup's quota of {_cpus(r.quota_cpus)} throttled it in "
                f"{100 * (r.throttled_share or 0.0):.0f}% of the periods (cpu.stat); it used "
                f"{r.cpu_used:.2f} CPUs",
            )
        )
    usual_wait = averages.median(o.wait_share for o in others) if others else 0.0
    if r.wait_share >= WAIT_SHARE and r.wait_share >= 2 * usual_wait:
        near = [n for n in ev.neighbours if n.cpu >= 0.2]
        who = "".join(f"; pid {n.pid} ({n.user}) used {n.cpu:.2f} CPUs: {n.cmdline[:60]}" for n in near[:1])
        found.append(
            (
                r.wait_share,
                f"it waited for a CPU {100 * r.wait_share:.0f}% of the time it could run (run queue delay, "
                f"/proc/PID/schedstat; the others {100 * usual_wait:.0f}%){who}",
            )
        )
    usual_faults = averages.median(o.majflt_per_s for o in others) if others else 0.0
    if r.majflt_per_s >= MAJFLT_PER_S and r.majflt_per_s >= FAULTS_APART * max(usual_faults, 1.0):
        # its main thread waits for the pages in D: before "waited on storage", which it explains
        found.append(
            (
                max(r.share("io"), WHY_SHARE) + 0.01,
                f"its memory was read back from disk: {r.majflt_per_s:.0f} major page faults a second "
                f"(/proc/PID/stat; the others {usual_faults:.0f}): swapped out or evicted",
            )
        )
    for where, what, detail in (
        ("idle", "slept", r.idle_detail),
        ("data", "waited on its DataLoader", r.data_detail),
        ("io", "waited on storage", ""),
    ):
        if r.share(where) >= WHY_SHARE:
            share = r.share(where)
            text = f"its main thread {what} in {100 * share:.0f}% of the looks" + (
                f" ({detail})" if detail else ""
            )
            found.append((share, text))
    gpu = _gpu_why(r, others)
    if gpu is not None:
        found.append(gpu)
    elif all(o.gpu is None for o in (r, *others)):  # no rank's own GPU known: the job's, as a hint
        slow_gpus = [c for c in ev.gpu_clocks if c.reasons and c.sm_mhz < 0.9 * c.sm_max_mhz]
        for c in slow_gpus[:1]:
            found.append((0.0, f"GPU {c.gpu_index} of the job runs at {c.sm_mhz} of {c.sm_max_mhz} MHz"))
    if not found and r.share("computing") >= WHY_SHARE and _ran_more(r, others):
        found.append(
            (
                r.share("computing"),
                f"its main thread computed in {100 * r.share('computing'):.0f}% of the looks: more work, or "
                "a slower CPU, than the others",
            )
        )
    if not found and recorded and r.share("collective") >= WHY_SHARE:
        # blocked like a rank in its collective, yet the recorders say the others waited for it
        call = f" ({r.where_detail})" if r.where == "collective" and r.where_detail else ""
        found.append(
            (
                r.share("collective"),
                f"its main thread was blocked{call} in {100 * r.share('collective'):.0f}% of the looks, "
                f"not waiting for the other ranks: it {WORK_OF_ITS_OWN} before each collective "
                "(its GPU's stream, a thread or process of its own)",
            )
        )
    return [text for _, text in sorted(found, key=lambda wt: -wt[0])]


def _glimpsed(r: RankView) -> bool:
    """Its recorder's intervals span too short a time to stand for the window."""
    return r.recorder is not None and r.recorder.covered_s < MIN_COVERED_S


def _ran_more(r: RankView, others: Sequence[RankView]) -> bool:
    """Its main thread ran longer than the others' (schedstat's run time), where that was measured."""
    usual = averages.median(o.cpu_used for o in others) if others else 0.0
    return usual <= 0.0 or r.cpu_used >= RAN_APART * usual


def _gpu_why(r: RankView, others: Sequence[RankView]) -> tuple[float, str] | None:
    """Its own GPU held below its clock by a limit (temperature, power), where the others' GPUs are not
    as slow: weighed by the share of its speed the clock takes away."""
    c = r.gpu
    if c is None or not gpu_rules.limited(c):
        return None
    share = c.sm_mhz / c.sm_max_mhz
    theirs = [o.gpu for o in others if o.gpu is not None and o.gpu.sm_max_mhz > 0]
    if theirs and averages.median(g.sm_mhz / g.sm_max_mhz for g in theirs) < share + GPU_APART:
        return None  # every rank's GPU as slow: the machine room, not this rank
    reasons = ", ".join(name for bit, name in gpu_rules.LIMITS.items() if c.reasons & bit)
    used = f", utilisation {c.utilization:.0f}%" if c.utilization is not None else ""
    usual = f"; the others' at {_ghz(round(averages.median(g.sm_mhz for g in theirs)))} GHz" if theirs else ""
    return (
        1.0 - share,
        f"its GPU {c.gpu_index} ran at {_ghz(c.sm_mhz)} GHz of {_ghz(c.sm_max_mhz)} GHz: {reasons} "
        f"(NVML clock event reasons 0x{c.reasons:x}){used}{usual}",
    )


def _remedy(r: RankView, why: list[str]) -> str:
    first = why[0] if why else ""
    if first.startswith("its GPU"):
        return (
            f"Rank {r.rank}'s GPU is held below its clock: check its cooling and power on its node "
            "(nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER), or ask the administrator to drain that "
            "GPU and move the rank to another."
        )
    if "quota" in first:
        return (
            f"Give rank {r.rank} the CPUs the others have: raise its cgroup's quota (cpu.max), or place "
            "the ranks evenly (one quota per rank sized alike)."
        )
    if "waited for a CPU" in first:
        return (
            f"Give rank {r.rank} CPUs nobody else uses: bind each rank to its own cores (taskset, "
            "torchrun --local-ranks-filter / numactl), and move or stop the processes that share them."
        )
    if "slept" in first:
        return f"Find what rank {r.rank} waits for in its sleep (a rank-dependent branch, a retry loop)."
    if "major page faults" in first:
        return (
            f"Give rank {r.rank} the memory it uses: its node swaps or evicts its pages (a memory limit "
            "of its cgroup, other processes, swap); give it more, or need less (a smaller batch or cache, "
            "fewer DataLoader workers)."
        )
    if WORK_OF_ITS_OWN in first:
        return (
            f"Find what rank {r.rank}'s main thread waits for before its collectives (`jobwarden dump`, or "
            f"py-spy dump --native --pid {r.pid}): its own GPU being slower or shared, or a thread or "
            "process of its own doing more than the others'."
        )
    if "DataLoader" in first:
        return f"Give rank {r.rank}'s DataLoader more workers or a faster source of data."
    return (
        f"Find what rank {r.rank} does that the others do not (`jobwarden profile`, a py-spy dump of pid "
        f"{r.pid}): uneven work, a slower device or node."
    )


def _factor(times: float) -> str:
    """1.6, 2.4, then whole numbers: the title is rewritten when it changes (shim.record.findings), and 9.5 or
    9.8 say the same."""
    return f"{times:.1f}" if times < 3 else f"{times:.0f}"


def _ghz(mhz: int) -> str:
    return f"{mhz / 1000:.2f}".rstrip("0").rstrip(".")


def _cpus(n: float) -> str:
    return f"{n:.2f}".rstrip("0").rstrip(".") + (" CPU" if abs(n - 1) < 1e-9 else " CPUs")

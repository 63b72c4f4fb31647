"""The job's own processes and threads that cost it time: DataLoader workers started anew every epoch
(worker-respawn) and Python threads that take turns on the GIL (gil-bound).

worker-respawn (research/slowness.md 2.14, 5.7): with `persistent_workers=False` every epoch's iterator
starts its workers again; with the spawn start method each re-imports torch and unpickles the dataset,
measured 1.84-2.07 s per epoch against 2 ms when persistent (fork: 26-63 ms). The shim sees it in the tree
it already keeps: the same parent starting a batch of children with the same command line, the previous
batch gone, again and again.

gil-bound (research/slowness.md 2.13): two spinning Python threads share one core: one holds the GIL, the
other sleeps on it (a futex wait, every 5 ms its switch interval). So the signature is per thread, from
/proc/PID/task/TID: two threads or more that want a CPU, using about one CPU together, each giving up its
CPU of its own accord over and over (voluntary context switches). Measured on this loaded 2-core machine
(load 6-7): two spinning Python threads 0.29 CPU each, 0.4 CPU waiting each, 130-150 voluntary switches a
second each; a torch matmul's two intra-op threads 0.33 CPU each, 0.67 waiting each, 0-2 voluntary
switches a second (preempted only). CPU and run delay alone cannot tell them apart under load; the sleeps
can, and do not depend on the load."""

from __future__ import annotations

import itertools
import os
import re
from collections import defaultdict

from jobwarden.model import Finding
from jobwarden.rules.speed import averages
from jobwarden.rules.speed.evidence import SpeedEvidence, ThreadsRead, ThreadUse, WorkerBatch

WARN_SHARE = 0.40  # a cost above this share is a warning; below, info

RESPAWNS = 2  # batches that replaced an ended one before it is a habit (three batches: two epochs' restarts)
ENDED_SLACK_S = 3.0  # the old batch may be seen gone a tick or two after the new one is seen born
STARTUP_S = 5.0  # a worker's CPU in its first seconds is its start-up cost (the shim measures this long)

BUSY_WANT = 0.30  # CPUs' worth a thread must want (use or wait for) to count as busy: not a logger's
BUSY_CPU = 0.05  # ... and use at least this much of it
GIL_SLEEPS = 20.0  # voluntary switches a second of a thread that takes turns (measured 130-150; native 0-2)
# ... and at most this many: the GIL is handed over at most once per switch interval (5 ms: 200 a second
# for the whole process), so a thread that sleeps far more often sleeps on something else (an fsync loop's
# writer thread: 770 a second, beside a computing thread at 22, on a loaded machine)
GIL_MAX_SLEEPS = 400.0
GIL_MAX_CPU = 1.15  # the busy threads together use at most about one CPU
GIL_READS = 3  # reads of one process (READ_EVERY_S apart) before judging
GIL_SHARE = 0.75  # of its observed time showing the signature


def _severity(share: float) -> str:
    return "warning" if share >= WARN_SHARE else "info"


# --- worker-respawn -------------------------------------------------------------------------------------

_DIGITS = re.compile(r"\d+")


def worker_kind(cmdline: str, parent_cmdline: str) -> str | None:
    """What kind of Python worker a child with `cmdline` of a parent with `parent_cmdline` is; None for
    anything else (a shell's subshells, a tool the job runs in a loop: those are not workers)."""
    if "multiprocessing" in cmdline:
        if "spawn_main" in cmdline or "--multiprocessing-fork" in cmdline:
            return "spawn"
        if "forkserver" in cmdline:
            return "forkserver"
    argv0 = os.path.basename(parent_cmdline.split(" ", 1)[0])
    if cmdline == parent_cmdline and argv0.startswith("python"):
        return "fork"
    return None


def command_key(cmdline: str) -> str:
    """The command line workers of one batch share: a spawn worker's pipe handle and tracker fd differ."""
    return _DIGITS.sub("N", cmdline)


def _respawned(batches: list[WorkerBatch]) -> list[WorkerBatch]:
    """The batches that replaced an ended one, in a run of such (the last run of them)."""
    run: list[WorkerBatch] = []
    for before, after in itertools.pairwise(batches):
        if before.ended_at is not None and before.ended_at <= after.born_at + ENDED_SLACK_S:
            run.append(after)
        else:
            run = []
    return run


def _lost_s(ev: SpeedEvidence, batch: WorkerBatch, typical: float | None) -> tuple[float, str]:
    """Seconds one respawn cost: the wait from the batch's birth to the next step when the step clock
    shows it (less a step's usual time), else the start-up CPU of its busiest worker."""
    after = next((m for m in ev.moves if m.at > batch.born_at), None)
    if after is not None and typical is not None and after.at - batch.born_at <= 120.0:
        return max(after.at - batch.born_at - typical, 0.0), "step clock"
    return batch.startup_cpu_s, "start-up CPU"


def _per_respawn(costs: list[tuple[float, str]]) -> tuple[float, str]:
    """Seconds a respawn costs on average: the step clock's measures where there are any (the newest batch
    has none before the next step), else the start-up CPU's."""
    clocked = [c for c, what in costs if what == "step clock"]
    if clocked:
        return averages.fmean(clocked), "step clock"
    return averages.fmean(c for c, _ in costs), "start-up CPU"


def _typical_step_s(ev: SpeedEvidence) -> float | None:
    gaps = [
        (b.at - a.at) / (b.step - a.step)
        for a, b in itertools.pairwise(ev.moves)
        if b.step > a.step and b.at > a.at
    ]
    return averages.median(gaps) if gaps else None


def worker_respawn(ev: SpeedEvidence) -> Finding | None:
    groups: dict[tuple[int, str], list[WorkerBatch]] = defaultdict(list)
    for b in ev.worker_batches:
        groups[(b.parent_pid, b.command)].append(b)
    best: tuple[float, int, list[WorkerBatch], list[tuple[float, str]]] | None = None
    typical = _typical_step_s(ev)
    for batches in groups.values():
        batches.sort(key=lambda b: b.born_at)
        again = _respawned(batches)
        if len(again) < RESPAWNS:
            continue
        span = again[-1].born_at - batches[batches.index(again[0]) - 1].born_at
        if span <= 0:
            continue
        costs = [_lost_s(ev, b, typical) for b in again]
        share = min(_per_respawn(costs)[0] * len(again) / span, 1.0)
        if best is None or share > best[0]:
            best = (share, batches[0].parent_pid, again, costs)
    if best is None:
        return None
    share, parent, again, costs = best
    first, last = again[0], again[-1]
    every = (last.born_at - first.born_at) / (len(again) - 1) if len(again) > 1 else 0.0
    per, how = _per_respawn(costs)
    spawn = first.kind in ("spawn", "forkserver")
    evidence = [
        f"pid {parent} started {len(again) + 1} batches of {first.count} worker"
        f"{'s' if first.count != 1 else ''} ({first.kind}), each after the previous one ended, "
        f"one every {every:.0f}s: {first.command[:100]}",
        *(
            f"batch of {b.count} seen at +{b.born_at - first.born_at:.0f}s: about {c:.1f}s lost ({what})"
            for b, (c, what) in zip(again[-5:], costs[-5:], strict=False)
        ),
    ]
    if ev.moves:
        evidence.append(f"the step counter moved meanwhile (last {ev.moves[-1].step} {ev.unit})")
    startup = (
        " With the spawn start method each new worker starts a Python interpreter, imports torch and "
        "unpickles the dataset again (measured 1.8-2.1 s per epoch against 2 ms when persistent)."
        if spawn
        else ""
    )
    return Finding(
        "worker-respawn",
        f"DataLoader workers started anew every {every:.0f}s: about {per:.1f}s lost each time "
        f"({100 * share:.0f}% of the time)",
        f"Process {parent} starts a new batch of {first.count} {first.kind} workers each time the previous "
        f"batch ends: a DataLoader without persistent_workers builds its workers again for every "
        f"epoch, and each restart costs about {per:.1f}s ({how}).{startup}",
        _severity(share),
        tuple(evidence),
        "Keep the workers between epochs: DataLoader(..., persistent_workers=True) (with num_workers > 0)"
        + (
            "; and where fork is safe (no CUDA in the parent, Linux), multiprocessing_context='fork' starts "
            "workers without re-importing."
            if spawn
            else "."
        ),
        (parent,),
    )


# --- gil-bound ------------------------------------------------------------------------------------------


def _busy(read: ThreadsRead) -> list[ThreadUse]:
    return [t for t in read.threads if t.cpu + t.waiting >= BUSY_WANT and t.cpu >= BUSY_CPU]


def gil_signature(read: ThreadsRead) -> bool:
    """Two threads or more busy that take turns (each sleeps often), about one CPU used by them all."""
    busy = _busy(read)
    turns = [t for t in busy if GIL_SLEEPS <= t.sleeps <= GIL_MAX_SLEEPS]
    return len(turns) >= 2 and sum(t.cpu for t in busy) <= GIL_MAX_CPU


def gil_bound(ev: SpeedEvidence) -> Finding | None:
    if ev.cpus < 2:
        return None  # one CPU: threads take turns on it anyway, GIL or not
    per_pid: dict[int, list[ThreadsRead]] = defaultdict(list)
    for r in ev.thread_reads:
        per_pid[r.pid].append(r)
    best: tuple[float, int, list[ThreadsRead]] | None = None
    for pid, reads in per_pid.items():
        total = sum(r.seconds for r in reads)
        if len(reads) < GIL_READS or total <= 0:
            continue
        gil = [r for r in reads if gil_signature(r)]
        if sum(r.seconds for r in gil) / total < GIL_SHARE:
            continue
        used = _used(gil)
        threads = averages.median_low([len(_busy(r)) for r in gil])
        could = min(float(threads), ev.cpus)
        share = max(1.0 - used / could, 0.0)
        if best is None or share > best[0]:
            best = (share, pid, gil)
    if best is None:
        return None
    share, pid, gil = best
    last = gil[-1]
    threads = averages.median_low([len(_busy(r)) for r in gil])
    used = _used(gil)
    seconds = sum(r.seconds for r in gil)
    evidence = [
        f"pid {pid}: {threads} busy threads used {used:.2f} CPUs together over {seconds:.0f}s "
        f"(/proc/PID/task/TID/schedstat), allowance {ev.cpus:g} CPUs",
        "last read, its busy threads: "
        + "; ".join(
            f"{t.cpu:.2f} CPU, {t.waiting:.2f} waiting for one, {t.sleeps:.0f} sleeps/s"
            for t in _busy(last)[:8]
        )
        + " (they give up the CPU of their own accord: they wait for each other, not for a CPU)",
    ]
    if last.cmdline:
        evidence.append(f"command: {last.cmdline[:100]}")
    return Finding(
        "gil-bound",
        f"{threads} Python threads share one CPU (the GIL): {used:.2f} CPUs used of {_could(threads, ev)}",
        f"Process {pid} runs {threads} busy threads but uses about one CPU in all while it may use "
        f"{ev.cpus:g}: the threads take turns, each sleeping until another lets go, the signature of "
        "Python's global interpreter lock (or of one lock they all need). It loses up to "
        f"{100 * share:.0f}% of what its threads could do in parallel. `jobwarden profile` (py-spy "
        "record --gil) shows which code holds it.",
        _severity(share),
        tuple(evidence),
        "Move the CPU-bound Python work to processes (multiprocessing, DataLoader workers with "
        "num_workers > 0, concurrent.futures.ProcessPoolExecutor), or into code that releases the GIL "
        "(numpy/torch operations on large arrays); threads only help Python code that waits on I/O.",
        (pid,),
    )


def _could(threads: int, ev: SpeedEvidence) -> str:
    n = min(float(threads), ev.cpus)
    return f"{n:g} it could use"


def _used(reads: list[ThreadsRead]) -> float:
    """CPUs the busy threads used together, on average over `reads`."""
    seconds = sum(r.seconds for r in reads)
    return sum(sum(t.cpu for t in _busy(r)) * r.seconds for r in reads) / seconds if seconds > 0 else 0.0

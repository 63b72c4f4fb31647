"""The job's own processes and threads that cost it time: DataLoader workers started anew every epoch
(worker-respawn) and Python threads that take turns on the GIL (gil-bound).

worker-respawn (research/slowness.md 2.14, 5.7): with `persistent_workers=False` every epoch's iterator
starts its workers again; with the spawn start method each re-imports torch and unpickles the dataset,
measured 1.84-2.07 s per epoch against 2 ms when persistent (fork: 26-63 ms). The shim sees it in the tree
it already keeps: the same parent starting a batch of children with the same command line, the previous
batch gone, again and again.

gil-bound (research/slowness.md 2.13): two spinning Python threads share one core: one holds the GIL, the
other sleeps on it (a futex wait, state S, not run-queue delay). So the signature is per-thread CPU from
/proc/PID/task/TID/schedstat: two threads or more each doing real work, the process using about one CPU
in all, and its threads wanting no more (CPU plus run-queue delay about one CPU): threads in native code
that release the GIL (a torch matmul's intra-op pool) use two CPUs, or, on a loaded machine, wait on the
run queue for the second, and so never look like this."""

from __future__ import annotations

import itertools
import os
import re
import statistics
from collections import defaultdict

from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import SpeedEvidence, ThreadsRead, WorkerBatch

WARN_SHARE = 0.40  # a cost above this share is a warning; below, info

RESPAWNS = 2  # batches that replaced an ended one before it is a habit (three batches: two epochs' restarts)
ENDED_SLACK_S = 3.0  # the old batch may be seen gone a tick or two after the new one is seen born
STARTUP_S = 5.0  # a worker's CPU in its first seconds is its start-up cost (the shim measures this long)

BUSY_THREAD = 0.20  # CPUs a thread must use to count as busy (a logger's or a monitor's thread does not)
GIL_MAX_CPU = 1.15  # the busy threads together use at most about one CPU ...
GIL_MAX_WANT = (
    1.30  # ... and want no more: CPU plus run-queue delay (native threads on a loaded machine wait)
)
GIL_MIN_WANT = 0.70  # below, the process is partly idle (I/O, sleeps): not held back by the GIL
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


def _typical_step_s(ev: SpeedEvidence) -> float | None:
    gaps = [
        (b.at - a.at) / (b.step - a.step)
        for a, b in itertools.pairwise(ev.moves)
        if b.step > a.step and b.at > a.at
    ]
    return statistics.median(gaps) if gaps else None


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
        share = min(sum(c for c, _ in costs) / span, 1.0)
        if best is None or share > best[0]:
            best = (share, batches[0].parent_pid, again, costs)
    if best is None:
        return None
    share, parent, again, costs = best
    first, last = again[0], again[-1]
    every = (last.born_at - first.born_at) / (len(again) - 1) if len(again) > 1 else 0.0
    per = sum(c for c, _ in costs) / len(costs)
    how = costs[-1][1]
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


def gil_signature(read: ThreadsRead) -> bool:
    """Two threads or more busy, about one CPU used in all, and no more wanted."""
    busy = [b for b in read.busy if b >= BUSY_THREAD]
    used = sum(read.busy)
    want = used + read.waiting
    return len(busy) >= 2 and used <= GIL_MAX_CPU and GIL_MIN_WANT <= want <= GIL_MAX_WANT


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
        used = sum(sum(r.busy) * r.seconds for r in gil) / sum(r.seconds for r in gil)
        threads = statistics.median_low([sum(1 for b in r.busy if b >= BUSY_THREAD) for r in gil])
        could = min(float(threads), ev.cpus)
        share = max(1.0 - used / could, 0.0)
        if best is None or share > best[0]:
            best = (share, pid, gil)
    if best is None:
        return None
    share, pid, gil = best
    last = gil[-1]
    threads = statistics.median_low([sum(1 for b in r.busy if b >= BUSY_THREAD) for r in gil])
    used = sum(sum(r.busy) * r.seconds for r in gil) / sum(r.seconds for r in gil)
    seconds = sum(r.seconds for r in gil)
    evidence = [
        f"pid {pid}: {threads} busy threads used {used:.2f} CPUs together over {seconds:.0f}s "
        f"(/proc/PID/task/TID/schedstat), allowance {ev.cpus:g} CPUs",
        "last read: threads at "
        + ", ".join(f"{b:.2f}" for b in last.busy[:8])
        + f" CPUs, {last.waiting:.2f} CPUs' worth waiting on the run queue (they want no more CPU)",
    ]
    if last.cmdline:
        evidence.append(f"command: {last.cmdline[:100]}")
    return Finding(
        "gil-bound",
        f"{threads} Python threads share one CPU (the GIL): {used:.2f} CPUs used of {_could(threads, ev)}",
        f"Process {pid} runs {threads} busy threads but uses about one CPU in all while it may use "
        f"{ev.cpus:g}: the threads take turns, the others asleep rather than waiting for a CPU, the "
        "signature of Python's global interpreter lock. It loses up to "
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

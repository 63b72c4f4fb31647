"""A worker process died and its parent is left waiting: `pool-worker-lost` (multiprocessing.Pool, which
never fails the lost task: bpo-22393, still true on 3.13) and `dataloader-worker-killed` (PyTorch, which
raises, or hangs when its SIGCHLD handler misses the death).

`pool-worker-lost` is an edge of the wait-for graph (rules.hang.graph): a thread waits in the pool's
result wait for the worker running the task, its only feeder, and that worker died.

Both fire on the evidence as soon as it exists, with no hang window: a death and a parent waiting in the
pool's result wait are already proof, and the watchdog judges on every death.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobwarden.model import Finding
from jobwarden.observations import Frame, ProcessDeath, ProcessStack, ThreadStack
from jobwarden.rules import frames, mltext
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.hang import graph
from jobwarden.rules.hang.graph import Edge
from jobwarden.rules.lookup import Lookup, describe
from jobwarden.rules.memory import oom_killed

# Where a parent waits for a pool's results (bare names: 3.8-3.10 py-spy shows no class).
_POOL_WAITS = (
    ("multiprocessing/pool.py", ("get", "wait", "next", "__next__", "map", "starmap", "apply")),
    ("concurrent/futures/_base.py", ("result", "as_completed", "wait", "_result_or_cancel")),
)
_POOL_MARKS = (  # a thread or frame that shows the process owns a pool
    ("multiprocessing/pool.py", ("_handle_workers", "_handle_results", "_handle_tasks")),
    ("concurrent/futures/process.py", ("run", "wait_result_broken_or_wakeup", "submit", "map")),
)
_REPLACEMENT = ("multiprocessing/pool.py", ("_repopulate_pool_static", "_maintain_pool"))
_DATALOADER_WAITS = (
    "torch/utils/data/dataloader.py",
    ("_try_get_data", "_get_data", "_next_data", "__next__", "_shutdown_workers"),
)
_DL_WORKER = ("torch/utils/data/_utils/worker.py", ("_worker_loop",))


@dataclass(frozen=True)
class Lost:
    death: ProcessDeath
    parent: ProcessStack
    waiting: ThreadStack
    at: Frame  # the pool wait frame in the parent
    edge: Edge  # the same, as the wait-for graph's edge


def _is_bad(death: ProcessDeath) -> bool:
    return not death.is_main and (death.signal is not None or death.exit_code not in (None, 0))


def _how(death: ProcessDeath, oom: Sequence[int]) -> str:
    if death.pid in oom:
        return "was killed by the OOM killer (SIGKILL)"
    if death.signal:
        return f"was killed by {death.signal}"
    return f"exited with code {death.exit_code}"


# --- pool-worker-lost -------------------------------------------------------------------------------


def pool_worker_lost(ev: RunEvidence) -> Finding | None:
    return lost_from(ev, pool_edges(ev))


def pool_edges(ev: RunEvidence) -> list[Edge]:
    """The wait-for graph's edges of this signature: a thread of a live parent waiting in a pool's result
    wait for the worker that died (abnormally) running the task, its only feeder."""
    look = Lookup.of(ev)
    edges = []
    for death in ev.deaths:
        found = _waiting_in_pool(look, death) if _is_bad(death) else None
        if found is not None:
            parent, thread, frame = found
            api = frames.where(_outward_from(thread, frame)[0])
            edges.append(Edge(parent.pid, thread.tid, "pool-result", api, (death.pid,), "died", at=frame))
    return edges


def lost_from(ev: RunEvidence, edges: Sequence[Edge]) -> Finding | None:
    """`pool-worker-lost` from the graph's edges: a pool's result wait whose feeder died."""
    look = Lookup.of(ev)
    lost = [
        x for e in edges if e.kind == "pool-result" and e.far == "died" and (x := _lost(look, e)) is not None
    ]
    if not lost:
        return None
    oom = oom_killed(ev)
    first = lost[0]
    death, parent = first.death, first.parent
    waiting_in = frames.where(_outward_from(first.waiting, first.at)[0])
    caller = frames.call_site(first.waiting)
    called_from = f", called from {frames.where(caller)}" if caller else ""
    evidence = [
        f"worker {describe(d.pid, d.cmdline)} {_how(d, oom)}" + (" (see oom-kill)" if d.pid in oom else "")
        for d in (x.death for x in lost)
    ]
    evidence.append(
        f"parent pid {parent.pid} is alive and its {frames.thread_label(first.waiting)} waits in "
        f"{frames.path_of(_outward_from(first.waiting, first.at), 3)}{called_from}"
    )
    evidence.extend(_replacements(look, parent.pid))
    steps = graph.lead_in(ev.pid, ev.waits, parent.pid)
    end = f"pid {death.pid} {_how(death, oom)}: the result never comes, everything waits for it"
    evidence.append(graph.chain_line(steps, first.edge, lambda p: describe(p, look.cmdline(p), 40), end))
    executor = frames.is_in(first.at, "concurrent/futures/_base.py")
    if executor:
        summary = (
            f"Worker pid {death.pid} {_how(death, oom)} while pid {parent.pid} waits for results in "
            f"{waiting_in}; a ProcessPoolExecutor marks itself broken and raises BrokenProcessPool."
        )
    else:
        summary = (
            f"Pool worker pid {death.pid} {_how(death, oom)} while running a task; multiprocessing.Pool "
            f"never fails the lost task, so pid {parent.pid} waits in {waiting_in} forever "
            "(CPython bpo-22393)."
        )
    return Finding(
        "pool-worker-lost",
        f"Pool worker {death.pid} died; pid {parent.pid} waits forever for its result",
        summary,
        "critical",
        tuple(evidence),
        _pool_remedy(any(x.death.pid in oom for x in lost), executor, ev.mem_limit_bytes is not None),
        tuple(dict.fromkeys([*(x.death.pid for x in lost), parent.pid])),
    )


def _lost(look: Lookup, edge: Edge) -> Lost | None:
    """The edge's dead feeder and its waiting thread, as the evidence has them."""
    death = look.deaths.get(edge.on[0]) if edge.on else None
    parent = look.stacks.get(edge.pid)
    thread = next((t for t in parent.threads if t.tid == edge.tid), None) if parent is not None else None
    if death is None or parent is None or thread is None:
        return None
    at = edge.at or next((f for s, n in _POOL_WAITS if (f := frames.find_frame(thread, s, n))), None)
    return Lost(death, parent, thread, at, edge) if at is not None else None


def _waiting_in_pool(look: Lookup, death: ProcessDeath) -> tuple[ProcessStack, ThreadStack, Frame] | None:
    if death.ppid is None or (look.processes and death.ppid not in look.processes):
        return None  # the parent is gone too: nobody is left waiting
    parent = look.stacks.get(death.ppid)
    if parent is None:
        return None
    for thread in parent.threads:
        for suffix, names in _POOL_WAITS:
            frame = frames.find_frame(thread, suffix, names)
            if frame is not None and _owns_pool(parent, suffix):
                return parent, thread, frame
    return None


def _owns_pool(parent: ProcessStack, wait_file: str) -> bool:
    """A wait in concurrent.futures counts only in a process that runs a process pool (a thread pool's
    futures wait the same way, and their workers are not processes)."""
    if wait_file == "multiprocessing/pool.py":
        return True
    return any(frames.find_frame(t, *_POOL_MARKS[1]) for t in parent.threads)


def _outward_from(thread: ThreadStack, frame: Frame) -> list[Frame]:
    py = frames.python_frames(thread)
    # the outermost consecutive frame of the same library is the API the job called (Pool.map)
    start = py.index(frame)
    end = start
    while end + 1 < len(py) and py[end + 1].file == frame.file:
        end += 1
    return [py[end], *py[start:end]]


def _replacements(look: Lookup, parent_pid: int) -> list[str]:
    lines = []
    for child in look.children(parent_pid):
        stack = look.stacks.get(child.pid)
        if stack is None:
            continue
        for thread in stack.threads:
            frame = frames.find_frame(thread, *_REPLACEMENT)
            if frame is not None and frames.find_frame(thread, _REPLACEMENT[0], ("_maintain_pool",)):
                lines.append(
                    f"pid {child.pid} is the worker the pool started in its place (forked by "
                    f"{frames.where(frame)}): the pool carries on, the lost task is never retried"
                )
                break
    return lines[:2]


def _pool_remedy(oom: bool, executor: bool, limited: bool) -> str:
    steps = []
    if oom:
        steps.append(
            f"Give the workers the memory they need{' (raise --mem-limit)' if limited else ''} or use less "
            "per worker (fewer "
            "processes, smaller chunks per task); see the oom-kill finding"
        )
    if executor:
        steps.append("Catch BrokenProcessPool and resubmit, or restart the job")
    else:
        steps.append(
            "The job will not recover: restart it. To fail fast instead of hanging, use "
            "concurrent.futures.ProcessPoolExecutor (it raises BrokenProcessPool when a worker dies) or keep "
            "Pool and wait with a timeout (map_async(...).get(timeout=...)); maxtasksperchild=N recycles "
            "workers before they grow"
        )
    return "; ".join(steps) + "."


# --- dataloader-worker-killed -----------------------------------------------------------------------


@dataclass(frozen=True)
class DlDeath:
    pid: int | None
    signal: str | None
    exit_code: int | None
    line: str | None  # the log line, when the evidence is PyTorch's message
    shm_hint: bool = False  # PyTorch suspects /dev/shm ("out of shared memory")


def dataloader_worker_killed(ev: RunEvidence) -> Finding | None:
    look = Lookup.of(ev)
    dead = _from_log(ev.log_tail) or _from_stacks(ev, look)
    if dead is None:
        return None
    oom = oom_killed(ev)
    signal = dead.signal or (look.deaths[dead.pid].signal if dead.pid in look.deaths else None)
    cause, remedy = _dl_cause(dead, signal, dead.pid in oom, dead.shm_hint)
    who = f"DataLoader worker pid {dead.pid}" if dead.pid else "A DataLoader worker"
    evidence = []
    if dead.line:
        evidence.append(f"output: {dead.line.strip()}")
    if dead.pid is not None:
        evidence.append(f"{describe(dead.pid, look.cmdline(dead.pid))}: {signal or dead.exit_code or 'died'}")
    evidence.extend(_dl_waiters(look))
    return Finding(
        "dataloader-worker-killed",
        f"{who} died ({signal or cause})",
        f"{who} {cause}; the training loop cannot get its batches.",
        "error",
        tuple(evidence),
        remedy,
        (dead.pid,) if dead.pid else (),
    )


def _from_log(lines: Sequence[str]) -> DlDeath | None:
    """PyTorch's own message, the most specific one present: "is killed by signal: Segmentation fault"
    wins over the "exited unexpectedly" chained after it (rules.mltext)."""
    found = mltext.dataloader_death(lines)
    if found is None or found.how == "timed-out":
        return None  # a timeout is a hang of a live worker, not a death
    return DlDeath(found.pid, found.signal, found.exit_code, found.line, found.shm_hint)


def _from_stacks(ev: RunEvidence, look: Lookup) -> DlDeath | None:
    for death in ev.deaths:
        if not _is_bad(death) or death.ppid is None:
            continue
        parent = look.stacks.get(death.ppid)
        own = look.stacks.get(death.pid)
        parent_waits = parent is not None and any(frames.threads_with(parent, *_DATALOADER_WAITS))
        was_worker = own is not None and any(frames.threads_with(own, *_DL_WORKER))
        if parent_waits or was_worker:
            return DlDeath(death.pid, death.signal, death.exit_code, None)
    return None


def _dl_waiters(look: Lookup) -> list[str]:
    lines = []
    for stack in look.live_stacks():
        for thread, frame in frames.threads_with(stack, *_DATALOADER_WAITS):
            lines.append(f"pid {stack.pid} {frames.thread_label(thread)} waits in {frames.where(frame)}")
    return lines[:2]


def _dl_cause(dead: DlDeath, signal: str | None, oom: bool, shm: bool) -> tuple[str, str]:
    if oom:
        return (
            "was killed by the OOM killer",
            "Memory ran out (see oom-kill): lower num_workers and prefetch_factor, keep the Dataset's data "
            "in numpy arrays or memory-mapped files (lists of Python objects are copied page by page into "
            "every forked worker), or raise --mem-limit.",
        )
    if signal == "SIGBUS" or shm:
        return (
            "hit a bus error in shared memory",
            "/dev/shm is too small for the batches the workers pass back (`df -h /dev/shm`): in Docker run "
            "with --shm-size=8g or --ipc=host (Kubernetes: an emptyDir with medium Memory on /dev/shm); "
            "or use fewer workers (num_workers) or smaller batches; or have the workers pass tensors through "
            "files instead: torch.multiprocessing.set_sharing_strategy('file_system').",
        )
    if signal == "SIGKILL":
        return (
            "was killed by SIGKILL",
            "No OOM evidence was collected: check `dmesg` for the OOM killer and who else sends SIGKILL; "
            "lower num_workers if memory is tight.",
        )
    what = f"was killed by {signal}" if signal else "exited unexpectedly"
    return (
        what,
        "Re-run with num_workers=0 to see the dataset's own error in the main process; give the DataLoader "
        "a timeout= so a stuck worker fails instead of hanging.",
    )

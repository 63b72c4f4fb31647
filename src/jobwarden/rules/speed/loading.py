"""The data-loading speed rules, judged on the main thread's Python stack sampled now and then (a
non-blocking py-spy dump every few seconds, shim.watch.stacksample) of the job's loop process (the one with
torch loaded that is no DataLoader worker, nearest the root: a wrapper shell is not it): where the training
loop spends its time.

- `input-bound`: the loop waits on its DataLoader's workers. Its main thread sits under
  `_MultiProcessingDataLoaderIter._next_data → _get_data → _try_get_data → Queue.get` while the
  `pt_data_worker` processes run flat out in `__getitem__` (research/slowness.md 2.1, measured 5.5: the
  main thread is idle in `_try_get_data`, the workers busy in `_worker_loop`). Workers that idle while the
  loop waits are another story (a slow hand-over), not a lack of workers: not said.
- `data-loading-in-main`: `num_workers=0`, the loop loads its own batches: the main thread is under
  `_SingleProcessDataLoaderIter._next_data → fetch → __getitem__` (or the collate), no worker process, and
  the job's CPU allowance has idle CPUs that workers would use (research 2.2).

A share of samples is a share of wall time: the samples are spread over minutes, at moments that do not
follow the loop's rhythm."""

from __future__ import annotations

from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import SpeedEvidence, StackSample
from jobwarden.rules.speed.steps import slowing

MIN_SAMPLES = 5  # fewer samples say nothing about a share
SHARE = 0.5  # of the samples: "most of the time"
WARN_SHARE = 0.7
WORKER_BUSY = 0.5  # CPUs per worker on average: the workers are busy, not waiting for indexes
IDLE_CPUS = 0.75  # the allowance left unused that a worker process would use
LOOP_BUSY = 0.5  # CPUs a job without workers uses before its stack is worth a closer look

LOADER_WORKER_COMM = "pt_data_worker"  # torch names its DataLoader worker processes so
TORCH_DATA = "torch/utils/data/"
DATALOADER = "torch/utils/data/dataloader.py"
FETCH = "torch/utils/data/_utils/fetch.py"
WAITS = frozenset({"_get_data", "_try_get_data"})  # the multi-process iterator waiting on its queue


def _name(function: str) -> str:
    """py-spy names a frame by its function or its qualified name (Class.method): the last part."""
    return function.rpartition(".")[2]


def waits_on_workers(sample: StackSample) -> bool:
    """The main thread is in the multi-process iterator's wait for a batch (its queue, or unpickling the
    batch the workers sent: both are the loop waiting on them)."""
    return any(_name(f) in WAITS and file.endswith(DATALOADER) for f, file in sample.frames)


def loads_in_main(sample: StackSample) -> bool:
    """The main thread fetches a batch itself: `_MapDatasetFetcher.fetch` / `_IterableDatasetFetcher.fetch`
    (the dataset's __getitem__ and the collate run under it)."""
    return any(_name(f) == "fetch" and file.endswith(FETCH) for f, file in sample.frames)


def _loading_frame(samples: tuple[StackSample, ...]) -> str | None:
    """What the loading does, most often: the first frame under the fetch that is not torch's own (the
    dataset's __getitem__), else the one just under it (the collate)."""
    counts: dict[str, int] = {}
    for s in samples:
        at = next(
            (i for i, (f, file) in enumerate(s.frames) if _name(f) == "fetch" and file.endswith(FETCH)), 0
        )
        inner = s.frames[:at]
        if not inner:
            continue
        own = next((fr for fr in reversed(inner) if TORCH_DATA not in fr[1]), inner[-1])
        key = f"{own[0]} ({own[1]})"
        counts[key] = counts.get(key, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else None


def worth_sampling(ev: SpeedEvidence) -> bool:
    """The counters alone say a rule read from the loop's stack may hold: its DataLoader workers work hard
    (half of what input-bound asks), or it has none and one busy loop leaves CPUs idle (the shape of
    data-loading-in-main), or its step rate just fell. The shim then samples the stack sooner for a while
    (shim.watch.stacksample's burst): the stacks decide, these never do."""
    if ev.loader_workers > 0:
        if ev.loader_worker_cpu / ev.loader_workers >= WORKER_BUSY / 2:
            return True
    elif ev.cpu_used >= LOOP_BUSY and ev.cpus - ev.cpu_used >= IDLE_CPUS:
        return True
    return slowing(ev.segments)


_MORE_CPUS = "Give the job more CPUs and the DataLoader more workers, "


def _pids(ev: SpeedEvidence) -> tuple[int, ...]:
    """The process whose stack was sampled (the loop), else the job's main one."""
    pid = ev.stack_pid if ev.stack_pid is not None else ev.main_pid
    return (pid,) if pid is not None else ev.pids[:1]


def input_bound(ev: SpeedEvidence) -> Finding | None:
    samples = ev.stack_samples
    if len(samples) < MIN_SAMPLES or ev.loader_workers <= 0:
        return None
    waiting = sum(1 for s in samples if waits_on_workers(s))
    share = waiting / len(samples)
    per_worker = ev.loader_worker_cpu / ev.loader_workers
    if share < SHARE or per_worker < WORKER_BUSY:
        return None
    n = ev.loader_workers
    more = n + max(1, int(ev.cpus - ev.cpu_used)) if ev.cpus - ev.cpu_used >= 1 else None
    return Finding(
        "input-bound",
        f"the loop waits on its DataLoader {100 * share:.0f}% of the time",
        f"The training loop's main thread waited for a batch from its {n} DataLoader worker"
        f"{'s' if n > 1 else ''} in {waiting} of {len(samples)} stack samples, while the workers used "
        f"{per_worker:.2f} CPUs each: they cannot produce batches as fast as the loop consumes them, and "
        "the model waits about that share of the time.",
        "warning" if share >= WARN_SHARE else "info",
        (
            f"main thread in DataLoader _get_data/_try_get_data (waiting on the workers' queue) in {waiting} "
            f"of {len(samples)} py-spy dumps over the last {ev.stack_span_s:.0f}s",
            f"{n} pt_data_worker process{'es' if n > 1 else ''} used {ev.loader_worker_cpu:.2f} CPUs "
            f"over {ev.window_s:.0f}s; the job {ev.cpu_used:.2f} of its {ev.cpus:g} CPUs",
        ),
        (f"Give the DataLoader more workers (num_workers={more}), " if more else _MORE_CPUS)
        + "pin_memory=True and a higher prefetch_factor when the GPU waits on copies, or make each sample "
        "cheaper: lighter transforms in __getitem__, decoding done once ahead of training, batched "
        "transforms on the GPU.",
        _pids(ev),
    )


def data_loading_in_main(ev: SpeedEvidence) -> Finding | None:
    samples = ev.stack_samples
    if len(samples) < MIN_SAMPLES or ev.loader_workers > 0:
        return None
    loading = [s for s in samples if loads_in_main(s)]
    share = len(loading) / len(samples)
    idle = ev.cpus - ev.cpu_used
    if share < SHARE or idle < IDLE_CPUS:
        return None
    workers = max(1, int(idle))
    what = _loading_frame(tuple(loading))
    return Finding(
        "data-loading-in-main",
        f"data loading runs in the main process {100 * share:.0f}% of the time (num_workers=0)",
        f"The DataLoader has no worker processes: the training loop loads and collates every batch itself, "
        f"{100 * share:.0f}% of its time, while {idle:.1f} of the job's {ev.cpus:g} CPUs sit idle. Worker "
        "processes would load the next batches while the loop computes.",
        "warning" if share >= WARN_SHARE else "info",
        (
            f"main thread under DataLoader fetch (the dataset's __getitem__ / collate) in {len(loading)} of "
            f"{len(samples)} py-spy dumps over the last {ev.stack_span_s:.0f}s"
            + (f", most often in {what}" if what else ""),
            f"no pt_data_worker process; the job used {ev.cpu_used:.2f} of its {ev.cpus:g} CPUs "
            f"over {ev.window_s:.0f}s",
        ),
        f"Load in worker processes: DataLoader(..., num_workers={workers}, persistent_workers=True) "
        "(HF Trainer: dataloader_num_workers; Lightning: the DataLoader you return), and keep each "
        "worker to one thread (torch does; numpy/OpenCV in __getitem__ may need OMP_NUM_THREADS=1).",
        _pids(ev),
    )

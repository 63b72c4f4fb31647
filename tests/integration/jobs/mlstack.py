"""Failures of the real ML stack, one scenario per name: PyTorch's DataLoader, torchrun (elastic) ranks,
concurrent.futures, loky and joblib, multiprocessing. For integration tests and for recording the
fixtures in tests/fixtures/mlstack (see the README there).

usage: python mlstack.py SCENARIO [--ready FIFO] [options]
       torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port P mlstack.py rank-... [options]

--ready FIFO: at the moment a test may act, the process named below writes one line
`<pid> <RANK or -> <what>\\n` (a FIFO, or any file: then appended). Without --ready nothing waits for a
reader. A writer waits at most --bound-s for a reader to open the FIFO.

Scenarios, and what dies (each ends by itself: a hang is bounded by --bound-s, then it exits 3). With
--ready, the dying worker announces itself just before its fault ("dl-worker", "pool-worker").
  dl-sigkill        a DataLoader worker SIGKILLs itself at item 10
  dl-segv           a DataLoader worker reads address 0 (ctypes.string_at(0)) at item 0: SIGSEGV
  dl-sigbus         a DataLoader worker touches a page of a mmap'ed file it truncated: SIGBUS
  dl-oom            a DataLoader worker allocates 1 MiB at a time until killed; run it under a memory
                    limit (--cap-mb bounds it: past that the worker exits 3)
  ppe-sigkill       a concurrent.futures.ProcessPoolExecutor worker SIGKILLs itself mid-task
  ppe-segv          the same, with a NULL read (SIGSEGV)
  loky-sigkill      loky.get_reusable_executor(): a worker SIGKILLs itself mid-task
  loky-segv         joblib.Parallel(backend="loky"): a worker reads address 0 mid-task
  mp-early-kill     the parent SIGKILLs a multiprocessing worker --delay-ms (0-10) after start(), joins
                    it and exits 1 (--start-method fork|spawn|forkserver); no announcement
  rank-raises       rank 1 raises ValueError after init_process_group and one all_reduce
  rank-killed       rank 1 blocks after init until killed from outside (announces "blocked"); without
                    --ready it SIGKILLs itself
  rank-hangs        rank 1 sleeps outside any collective ("sleeping") while rank 0 waits in all_reduce
                    (announced just before the call: "all_reduce"): two lines on the FIFO
  rank-wrong-op     after 4 more all_reduces, rank 1 calls broadcast where rank 0 calls all_reduce (#6);
                    each announces its call just before it ("broadcast", "all_reduce")
  rank-skips        rank 1 skips the third of 4 more all_reduces, then sleeps ("skipped") while rank 0
                    waits in the last of them (#5; it announces "all_reduce" before the 4)
  rank-barrier      3 ranks (--nproc_per_node 3): after 4 more all_reduces rank 2 calls barrier where ranks
                    0 and 1 call all_reduce (#6); each announces its call
  rank-size-mismatch  after 4 more all_reduces rank 1 calls all_reduce on 8 floats where rank 0 calls it on
                    4: gloo aborts rank 0 (SIGABRT, "Received data size doesn't match expected size")
  fsync-checkpoint  healthy: torch.save + fsync + rename of a checkpoint, --iterations times; exit 0
                    (announces "checkpointing"; under torchrun, one file per rank)
  resource-tracker  healthy: a spawn-context Semaphore and a SharedMemory block shared with a child start
                    multiprocessing's resource tracker; exit 0 (announces "resource-tracker <its pid>")
The rank scenarios use the gloo backend; --record wraps them in torch.distributed.elastic's @record, so
that a failing rank writes its TORCHELASTIC_ERROR_FILE.

Imports of torch, joblib and loky happen inside the scenarios that need them, so that the others start
fast (torch takes seconds to import on this machine).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import mmap
import os
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

BOUND_EXIT = 3  # a hang scenario that reached --bound-s without being ended from outside
_ARGS: argparse.Namespace | None = None  # set in main()
_ARGS_ENV = "MLSTACK_ARGS"


def opts() -> argparse.Namespace:
    """The parsed options. A worker started by spawn or forkserver (loky's workers; any pool on Python
    3.14, whose default is forkserver) re-imports this file instead of inheriting main's memory: it
    rebuilds them from the environment main() left."""
    global _ARGS
    if _ARGS is None:
        _ARGS = argparse.Namespace(**json.loads(os.environ[_ARGS_ENV]))
    return _ARGS


# --- the handshake ----------------------------------------------------------------------------------


def announce(what: str) -> None:
    """Write `<pid> <RANK or -> <what>` to --ready, if given. A FIFO is opened non-blocking and retried:
    a blocking open would hang for ever if the test never reads, and the scenario must stay bounded."""
    path = opts().ready
    if not path:
        return
    line = f"{os.getpid()} {os.environ.get('RANK', '-')} {what}\n".encode()
    if not _is_fifo(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    else:
        fd = _open_fifo_writer(path, time.monotonic() + opts().bound_s)
    try:
        os.write(fd, line)  # shorter than PIPE_BUF: one atomic write, never interleaved with another rank's
    finally:
        os.close(fd)


def _is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def _open_fifo_writer(path: str, deadline: float) -> int:
    while True:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            # ENXIO: no reader has the FIFO open yet (fifo(7)); wait for one, up to the bound
            if err.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def say(text: str, stream: Any = None) -> None:
    """One line in one write: print() writes the text and its newline apart, and two ranks sharing a pipe
    then interleave mid-line ("rank 0: ...rank 1: ...")."""
    out = stream or sys.stdout
    out.write(text + "\n")
    out.flush()


def wait_for_bound(what: str) -> int:
    """Block (sleeping, off any CPU) until killed from outside; at --bound-s give up and return 3."""
    deadline = time.monotonic() + opts().bound_s
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    say(f"{what}: still alive after {opts().bound_s:g}s, giving up", sys.stderr)
    return BOUND_EXIT


# --- faults, the real thing -------------------------------------------------------------------------


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def read_null() -> None:
    ctypes.string_at(0)  # a real NULL read: SIGSEGV inside libc's strlen


def touch_truncated_mmap() -> None:
    """SIGBUS: a page of a file mapping that lies past the end of the file (mmap(2), "SIGBUS")."""
    with tempfile.TemporaryFile() as f:
        f.write(b"\0" * mmap.PAGESIZE)
        f.flush()
        mapped = mmap.mmap(f.fileno(), mmap.PAGESIZE)
        f.truncate(0)
        mapped[0]  # the read faults: the page is past the end of the file


def allocate_until_killed() -> None:
    hog = []
    for _ in range(opts().cap_mb):
        hog.append(b"\1" * (1 << 20))  # bytes * n writes every page: memory really used, not reserved
    say(f"allocated {opts().cap_mb} MiB and nobody killed me", sys.stderr)
    os._exit(BOUND_EXIT)


def busy_then(fault: Callable[[], None]) -> None:
    """Mid-task: some work done, then the fault (what a crash inside a numeric library looks like)."""
    sum(i * i for i in range(20_000))
    fault()


# --- DataLoader -------------------------------------------------------------------------------------


class FaultyDataset:
    """A map-style dataset (no torch base class needed) whose item `at` runs `fault` in the worker."""

    def __init__(self, fault: Callable[[], None], at: int, announce_as: str | None = None) -> None:
        self.fault, self.at, self.announce_as = fault, at, announce_as

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        import torch

        if i == self.at:
            if self.announce_as:
                announce(self.announce_as)
            self.fault()
        return torch.zeros(4)


def run_dataloader(fault: Callable[[], None], at: int, announce_as: str | None = None) -> int:
    from torch.utils.data import DataLoader

    loader = DataLoader(FaultyDataset(fault, at, announce_as), batch_size=4, num_workers=2)
    batches = sum(1 for _ in loader)  # the worker's death raises RuntimeError here: exit 1
    say(f"{batches} batches")
    return 0


# --- process pools ----------------------------------------------------------------------------------


def pool_task(i: int, fault_name: str) -> int:
    if i == 1:
        announce("pool-worker")
        busy_then(FAULTS[fault_name])
    return i * i


def run_process_pool(fault_name: str) -> int:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(pool_task, i, fault_name) for i in range(4)]
        say(str([f.result() for f in futures]))  # BrokenProcessPool: exit 1
    return 0


def run_loky_executor(fault_name: str) -> int:
    from loky import get_reusable_executor

    pool = get_reusable_executor(max_workers=2)
    futures = [pool.submit(pool_task, i, fault_name) for i in range(4)]
    say(str([f.result() for f in futures]))  # TerminatedWorkerError: exit 1
    return 0


def run_joblib_loky(fault_name: str) -> int:
    from joblib import Parallel, delayed

    results = Parallel(n_jobs=2, backend="loky")(delayed(pool_task)(i, fault_name) for i in range(4))
    say(str(results))  # TerminatedWorkerError: exit 1
    return 0


def idle() -> None:
    time.sleep(opts().bound_s)


def run_mp_early_kill() -> int:
    import multiprocessing

    worker = multiprocessing.get_context(opts().start_method).Process(target=idle)
    worker.start()
    time.sleep(opts().delay_ms / 1000)
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    say(f"worker {worker.pid} ended with exitcode {worker.exitcode}: giving up", sys.stderr)
    return 1


# --- torchrun ranks ---------------------------------------------------------------------------------


def joined_group() -> int:
    """init_process_group (gloo, from torchrun's env), one all_reduce; the rank. The group's timeout
    bounds every later collective, so rank 0 never waits past --bound-s plus a margin."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        raise SystemExit("run the rank scenarios under torchrun (RANK is not set)")
    dist.init_process_group("gloo", timeout=timedelta(seconds=opts().bound_s + 10))
    total = torch.ones(1)
    dist.all_reduce(total)
    say(f"rank {dist.get_rank()}: all_reduce -> {total.item():g}")
    return dist.get_rank()


def all_reduce_again() -> int:
    """Rank 0's next step: a collective that waits for rank 1."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    return 0


def rank_raises() -> int:
    if joined_group() == 1:
        raise ValueError("bad batch shape (2, 3): expected (2, 4)")
    return all_reduce_again()


def rank_killed() -> int:
    if joined_group() != 1:
        return all_reduce_again()
    if not opts().ready:
        kill_self()
    announce("blocked")
    return wait_for_bound("rank 1")


def rank_hangs() -> int:
    if joined_group() == 1:
        announce("sleeping")
        return wait_for_bound("rank 1")
    announce("all_reduce")  # written just before the call: a test samples it from here on
    return all_reduce_again()


def steps(skip: int | None = None) -> None:
    """--steps more all_reduces (4: #2-#5 after joined_group's #1), of the same shape; rank 1 skips the
    `skip`th."""
    import torch
    import torch.distributed as dist

    for i in range(opts().steps):
        if i != skip or dist.get_rank() != 1:
            dist.all_reduce(torch.ones(4))


def rank_wrong_op() -> int:
    import torch
    import torch.distributed as dist

    rank = joined_group()
    steps()
    if rank == 1:
        announce("broadcast")
        dist.broadcast(torch.ones(4), src=0)  # rank 0 never broadcasts: this waits for ever
    else:
        announce("all_reduce")
        dist.all_reduce(torch.ones(4))
    return wait_for_bound(f"rank {rank}")


def rank_skips() -> int:
    if joined_group() == 1:
        steps(skip=2)  # its 3rd all_reduce pairs with rank 0's 3rd (gloo matches by order): one short
        announce("skipped")
        return wait_for_bound("rank 1")
    announce("all_reduce")  # before its steps: the last of them (#5) waits for ever
    steps()
    return all_reduce_again()


def rank_barrier() -> int:
    import torch
    import torch.distributed as dist

    rank = joined_group()
    steps()
    if rank == 2:
        announce("barrier")
        dist.barrier()
    else:
        announce("all_reduce")
        dist.all_reduce(torch.ones(4))
    return wait_for_bound(f"rank {rank}")


def rank_size_mismatch() -> int:
    import torch
    import torch.distributed as dist

    rank = joined_group()
    steps()
    dist.all_reduce(torch.ones(8 if rank == 1 else 4))
    return wait_for_bound(f"rank {rank}")


def as_rank(scenario: Callable[[], int]) -> Callable[[], int]:
    if not opts().record:
        return scenario
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(scenario)  # type: ignore[return-value]


# --- healthy ----------------------------------------------------------------------------------------


def fsync_checkpoint() -> int:
    import torch

    rank = os.environ.get("RANK", "0")
    with tempfile.TemporaryDirectory(prefix="mlstack-ckpt-") as folder:
        final = os.path.join(folder, f"checkpoint-rank{rank}.pt")
        announce("checkpointing")
        for step in range(opts().iterations):
            state = {"step": step, "weights": torch.full((256, 1024), float(step))}  # 1 MiB
            save_durably(torch, state, final)
        say(f"rank {rank}: {opts().iterations} checkpoints written and fsynced")
    return 0


def save_durably(torch: Any, state: dict[str, Any], final: str) -> None:
    """The pattern real trainers use: write aside, fsync, rename over, fsync the folder (rename(2) is
    atomic, but only the folder's fsync makes the new name survive a crash)."""
    part = final + ".part"
    with open(part, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, final)
    folder = os.open(os.path.dirname(final), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def fill_shared(name: str, sem: Any) -> None:
    from multiprocessing import shared_memory

    block = shared_memory.SharedMemory(name=name)
    with sem:
        block.buf[:5] = b"hello"
    block.close()


def resource_tracker() -> int:
    import multiprocessing
    from multiprocessing import resource_tracker as tracker
    from multiprocessing import shared_memory

    ctx = multiprocessing.get_context("spawn")
    sem = ctx.Semaphore()  # a named POSIX semaphore: registered with the resource tracker, which starts
    block = shared_memory.SharedMemory(create=True, size=4096)
    try:
        announce(f"resource-tracker {tracker._resource_tracker._pid}")  # type: ignore[attr-defined]
        child = ctx.Process(target=fill_shared, args=(block.name, sem))
        child.start()
        child.join()
        say(f"child wrote {bytes(block.buf[:5])!r}, exitcode {child.exitcode}")
    finally:
        block.close()
        block.unlink()
    return 0 if child.exitcode == 0 else 1


# --- the table --------------------------------------------------------------------------------------

FAULTS: dict[str, Callable[[], None]] = {"sigkill": kill_self, "segv": read_null}

SCENARIOS: dict[str, Callable[[], int]] = {
    "dl-sigkill": lambda: run_dataloader(kill_self, 10, "dl-worker"),
    "dl-segv": lambda: run_dataloader(read_null, 0, "dl-worker"),
    "dl-sigbus": lambda: run_dataloader(touch_truncated_mmap, 0, "dl-worker"),
    "dl-oom": lambda: run_dataloader(allocate_until_killed, 0, "dl-worker"),
    "ppe-sigkill": lambda: run_process_pool("sigkill"),
    "ppe-segv": lambda: run_process_pool("segv"),
    "loky-sigkill": lambda: run_loky_executor("sigkill"),
    "loky-segv": lambda: run_joblib_loky("segv"),
    "mp-early-kill": run_mp_early_kill,
    "rank-raises": lambda: as_rank(rank_raises)(),
    "rank-killed": lambda: as_rank(rank_killed)(),
    "rank-hangs": lambda: as_rank(rank_hangs)(),
    "rank-wrong-op": rank_wrong_op,
    "rank-skips": rank_skips,
    "rank-barrier": rank_barrier,
    "rank-size-mismatch": rank_size_mismatch,
    "fsync-checkpoint": fsync_checkpoint,
    "resource-tracker": resource_tracker,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--ready", metavar="FIFO", help="write `<pid> <RANK or -> <what>` here when ready")
    parser.add_argument("--bound-s", type=float, default=120.0, help="upper bound of every wait (exit 3)")
    parser.add_argument("--delay-ms", type=float, default=5.0, help="mp-early-kill: kill after (0-10)")
    parser.add_argument("--start-method", default="fork", choices=("fork", "spawn", "forkserver"))
    parser.add_argument("--iterations", type=int, default=20, help="fsync-checkpoint: checkpoints to write")
    parser.add_argument("--cap-mb", type=int, default=4096, help="dl-oom: give up (exit 3) past this")
    parser.add_argument("--record", action="store_true", help="rank scenarios: wrap in elastic's @record")
    parser.add_argument("--steps", type=int, default=4, help="rank scenarios: all_reduces before they part")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    global _ARGS
    _ARGS = parse_args(argv)
    os.environ[_ARGS_ENV] = json.dumps(vars(_ARGS))  # inherited by every worker and rank it starts
    return SCENARIOS[_ARGS.scenario]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

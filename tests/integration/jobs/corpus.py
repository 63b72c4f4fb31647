"""Failures on stacks jobwarden's verdict was never tuned for: launchers, executors and frameworks that
relay a worker's exception, report a child's exit, or make its peers fail after it. One scenario per name;
the process that fails first announces itself, so a test knows which pid the verdict must name.

usage: python corpus.py SCENARIO [--ready FILE] [options]

--ready FILE: the culprit appends `<pid> <rank or -> <what> <unix time>` just before its fault (and a healthy
scenario when it starts its quiet spell). Every wait is bounded by --bound-s.

Scenarios (the culprit, then what follows from it):
  spawn-raises       torch.multiprocessing.spawn, 2 processes joined in a gloo group: process 1 raises
                     ValueError; spawn re-raises it in the main process as ProcessRaisedException
  spawn-exits        the same, process 1 calls os._exit(3) (no traceback): ProcessExitedException
  dl-raises          a DataLoader worker raises ValueError in __getitem__: the main process re-raises it
                     ("Caught ValueError in DataLoader worker process 0")
  ppe-raises         a concurrent.futures.ProcessPoolExecutor task raises: re-raised with _RemoteTraceback
  joblib-raises      joblib.Parallel (loky) task raises: joblib re-raises it in the main process
  pool-raises        multiprocessing.Pool.map task raises: re-raised with its RemoteTraceback
  subprocess-chain   main runs a child with subprocess.run(check=True), which runs a grandchild the same
                     way: the grandchild raises; both parents raise CalledProcessError
  gloo-rank          one rank of a group started by a shell script (RANK, WORLD_SIZE, MASTER_* from the
                     script): rank 1 exits 3 with no traceback after one all_reduce, rank 0 then fails in
                     gloo ("Connection closed by peer"); see ranks.sh
  torchrun-exits     under torchrun: rank 1 exits 3 with no traceback after one all_reduce
  lightning-raises   PyTorch Lightning, DDP on 2 CPU processes (its own launcher re-runs this script with
                     LOCAL_RANK=1): training_step raises on rank 1
  produce, consume   the two ends of a shell pipeline (pipeline.sh): consume raises after --lines lines,
                     produce then dies writing into the closed pipe
Healthy, for the findings that must be resolved:
  quiet-then-talk    prints, says nothing for --quiet-s seconds (sleeping: no CPU, no I/O), then prints
                     and exits 0
  fsync-quiet        writes and fsyncs a file at about --rate-mb MiB/s for --seconds, printing nothing
  ticking            prints a line every --every-s seconds for --seconds, or until --until FILE exists
                     (a job a test stops and resumes)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_ARGS: argparse.Namespace | None = None
_ARGS_ENV = "CORPUS_ARGS"


def opts() -> argparse.Namespace:
    """The parsed options; a spawned worker (loky, spawn) rebuilds them from the environment."""
    global _ARGS
    if _ARGS is None:
        _ARGS = argparse.Namespace(**json.loads(os.environ[_ARGS_ENV]))
    return _ARGS


def announce(what: str, rank: object = None) -> None:
    """Append `<pid> <rank or -> <what> <unix time>` to --ready: one write below PIPE_BUF, never
    interleaved with another process's line."""
    if not opts().ready:
        return
    label = rank if rank is not None else os.environ.get("RANK", "-")
    fd = os.open(opts().ready, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {label} {what} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# --- torch.multiprocessing.spawn ---------------------------------------------------------------------


def _spawned(index: int, world: int, port: int, fault: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=index, world_size=world, timeout=timedelta(seconds=opts().bound_s))
    dist.all_reduce(torch.ones(1))
    if index == 1:
        announce("spawn-worker", index)
        if fault == "raise":
            raise ValueError("bad batch shape (2, 3): expected (2, 4)")
        os._exit(3)
    dist.all_reduce(torch.ones(1))  # waits for process 1, which never comes
    dist.destroy_process_group()


def run_spawn(fault: str) -> int:
    import torch.multiprocessing as mp

    mp.spawn(_spawned, args=(2, opts().port, fault), nprocs=2, join=True)
    return 0


# --- DataLoader ----------------------------------------------------------------------------------------


class RaisingDataset:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        import torch

        if i == 9:
            announce("dl-worker")
            raise ValueError(f"corrupt record {i}: expected 4 fields, got 3")
        return torch.zeros(4)


def run_dl_raises() -> int:
    from torch.utils.data import DataLoader

    say(f"{sum(1 for _ in DataLoader(RaisingDataset(), batch_size=4, num_workers=2))} batches")
    return 0


# --- executors and pools -------------------------------------------------------------------------------


def task(i: int) -> int:
    if i == 2:
        announce("pool-worker")
        raise KeyError(f"no feature named 'age_{i}' in the input row")
    return i * i


def run_ppe_raises() -> int:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        say(str(list(pool.map(task, range(6)))))
    return 0


def run_joblib_raises() -> int:
    from joblib import Parallel, delayed

    say(str(Parallel(n_jobs=2, backend="loky")(delayed(task)(i) for i in range(6))))
    return 0


def run_pool_raises() -> int:
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        say(str(pool.map(task, range(6))))
    return 0


# --- subprocess chains ---------------------------------------------------------------------------------


def run_subprocess_chain() -> int:
    """Main -> child -> grandchild, each parent with check=True."""
    me = [sys.executable, os.path.abspath(__file__)]
    subprocess.run([*me, "chain-child"], check=True)
    return 0


def run_chain_child() -> int:
    me = [sys.executable, os.path.abspath(__file__)]
    subprocess.run([*me, "chain-grandchild"], check=True)
    return 0


def run_chain_grandchild() -> int:
    announce("grandchild")
    raise FileNotFoundError(2, "No such file or directory", "/data/shard-0007.parquet")


# --- ranks of a process group, started by a shell script or torchrun ----------------------------------


def run_gloo_rank() -> int:
    """One rank, its rank and peers from the environment (torch's env:// rendezvous)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=opts().bound_s))
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        announce("rank-exits")
        sys.stdout.flush()
        os._exit(3)  # no traceback, no message: what a native library's exit(3) looks like
    say(f"rank {dist.get_rank()}: waiting for rank 1")
    dist.all_reduce(torch.ones(1))
    return 0


# --- PyTorch Lightning ---------------------------------------------------------------------------------


def run_lightning() -> int:
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if self.global_rank == 1 and batch_idx == 2:
                announce("lightning-rank", self.global_rank)
                raise RuntimeError("loss is nan at step 2")
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(data, batch_size=4))
    return 0


# --- a shell pipeline ----------------------------------------------------------------------------------


def run_produce() -> int:
    n = 0
    deadline = time.monotonic() + opts().bound_s
    while time.monotonic() < deadline:
        sys.stdout.write(f"row {n}\n")
        n += 1
        if n % 100 == 0:
            sys.stdout.flush()
    return 3


def run_consume() -> int:
    for i, line in enumerate(sys.stdin):
        if i == opts().lines:
            announce("consumer")
            raise ValueError(f"unparsable row {line.strip()!r}")
    return 0


# --- healthy ---------------------------------------------------------------------------------------------


def run_quiet_then_talk() -> int:
    say("loading")
    announce("quiet")
    time.sleep(opts().quiet_s)  # the job's own quiet spell, not a test waiting
    say("loaded; done")
    return 0


def run_fsync_quiet() -> int:
    chunk = os.urandom(64 << 10)
    per_s = max(1, int(opts().rate_mb * 16))  # 64 KiB chunks
    announce("fsyncing")
    with tempfile.TemporaryDirectory(prefix="corpus-fsync-") as folder:
        path = os.path.join(folder, "shard.bin")
        end = time.monotonic() + opts().seconds
        with open(path, "wb") as f:
            while time.monotonic() < end:
                began = time.monotonic()
                for _ in range(per_s):
                    f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
                time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))  # the job's own pace
                if f.tell() > 256 << 20:
                    f.seek(0)
    return 0


def run_ticking() -> int:
    announce("ticking")
    end = time.monotonic() + opts().seconds
    n = 0
    while time.monotonic() < end and not (opts().until and os.path.exists(opts().until)):
        say(f"tick {n}")
        n += 1
        time.sleep(opts().every_s)  # the job's own pace
    return 0


SCENARIOS: dict[str, Callable[[], int]] = {
    "spawn-raises": lambda: run_spawn("raise"),
    "spawn-exits": lambda: run_spawn("exit"),
    "dl-raises": run_dl_raises,
    "ppe-raises": run_ppe_raises,
    "joblib-raises": run_joblib_raises,
    "pool-raises": run_pool_raises,
    "subprocess-chain": run_subprocess_chain,
    "chain-child": run_chain_child,
    "chain-grandchild": run_chain_grandchild,
    "gloo-rank": run_gloo_rank,
    "torchrun-exits": run_gloo_rank,
    "lightning-raises": run_lightning,
    "produce": run_produce,
    "consume": run_consume,
    "quiet-then-talk": run_quiet_then_talk,
    "fsync-quiet": run_fsync_quiet,
    "ticking": run_ticking,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--ready", metavar="FILE", help="append `<pid> <rank or -> <what> <time>` here")
    parser.add_argument("--bound-s", type=float, default=60.0, help="upper bound of every wait")
    parser.add_argument("--port", type=int, default=29500, help="spawn-*: the group's port on 127.0.0.1")
    parser.add_argument("--lines", type=int, default=1000, help="consume: raise at this line")
    parser.add_argument("--quiet-s", type=float, default=5.0, help="quiet-then-talk: the quiet spell")
    parser.add_argument("--seconds", type=float, default=10.0, help="fsync-quiet, ticking: how long")
    parser.add_argument("--rate-mb", type=float, default=1.2, help="fsync-quiet: MiB per second")
    parser.add_argument("--every-s", type=float, default=0.5, help="ticking: a line this often")
    parser.add_argument("--until", metavar="FILE", help="ticking: end once this file exists")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    global _ARGS
    if argv and argv[0].startswith("chain-"):  # the chain's own processes: options from the environment
        return SCENARIOS[argv[0]]()
    _ARGS = parse_args(argv)
    os.environ[_ARGS_ENV] = json.dumps(vars(_ARGS))  # inherited by every worker, rank and child
    return SCENARIOS[_ARGS.scenario]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

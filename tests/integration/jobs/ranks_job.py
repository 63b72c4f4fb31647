"""A rank of a gloo job under torchrun, for the straggler tests (tests/integration/test_speed_ranks.py).
Each step: a little matrix work, then an all_reduce with every rank (so the ranks keep step); the step
count in a tqdm bar of its own (the hooks read it per process).

  ranks_job.py balanced            every rank alike
  ranks_job.py sleep RANK [UNTIL]  RANK also sleeps SLEEP_S in each step (in its main thread), until the
                                   file UNTIL exists (then it catches up)
  ranks_job.py sleep-after RANK FROM   every rank alike until the file FROM exists; then RANK sleeps
                                   SLEEP_S in each step (a straggler that appears mid-run)
  ranks_job.py quota RANK DIR      RANK puts itself into the cpu cgroup DIR (root; its quota) before its
                                   first step, and each step's work is larger (the quota must bite)
  ranks_job.py heavier-after RANK FROM  every rank alike until the file FROM exists; then RANK does half
                                   as much work again in each step (a 1.5x straggler that appears mid-run)
  ranks_job.py device RANK         RANK's step waits for work it hands to a thread of its own that takes
                                   SLEEP_S longer (as a rank waits for its GPU's stream): its main
                                   thread is blocked in a futex, as the others' are in their all_reduce

Rank 0 writes "ready" once every rank has done READY_STEPS steps in its mode. Runs until stopped."""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist
from tqdm import tqdm

SLEEP_S = 0.03
READY_STEPS = 20


def main(argv: list[str]) -> int:
    mode = argv[0]
    slow = int(argv[1]) if len(argv) > 1 else -1
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    if mode == "quota" and rank == slow:
        with open(f"{argv[2]}/cgroup.procs", "w") as fh:
            fh.write("0")  # this process (the writer's own thread group)
    size = {"quota": 160, "heavier-after": 256}.get(mode, 96)
    x = torch.randn(size, size)
    total = torch.zeros(1)
    device = ThreadPoolExecutor(1, "device") if mode == "device" and rank == slow else None
    for step in tqdm(range(10**9), mininterval=0.5, desc=f"rank {rank}"):
        if device is not None:
            y = device.submit(_slow_device, x).result()  # the main thread waits (futex) for its "device"
        heavier = mode == "heavier-after" and rank == slow and os.path.exists(argv[2])
        for _ in range(6 if heavier else 4):
            y = x @ x
        if rank == slow and _sleeps(mode, argv):
            time.sleep(SLEEP_S)  # the straggler's extra time: the others wait for it in all_reduce
        total += float(y[0, 0] > 1e9)
        dist.all_reduce(total)
        if step == READY_STEPS and rank == 0:
            print("ready", flush=True)
    return 0


def _slow_device(x: torch.Tensor) -> torch.Tensor:
    time.sleep(SLEEP_S)
    return x @ x


def _sleeps(mode: str, argv: list[str]) -> bool:
    if mode == "sleep":
        return not (len(argv) > 2 and os.path.exists(argv[2]))
    return mode == "sleep-after" and os.path.exists(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The S3 seed case: a multiprocessing.Pool whose worker dies; pool.map then waits for ever.

usage: pool_lost_worker.py FIFO kill|oom
The first task writes its worker's pid to FIFO. Then
kill: it sleeps (the test SIGKILLs that worker);
oom:  it waits for a line on FIFO.go, then allocates far past the job's --mem-limit and is OOM-killed.
"""

import multiprocessing
import os
import sys
import time

fifo, mode = sys.argv[1], sys.argv[2]


def task(i: int) -> int:
    if i == 0:
        with open(fifo, "w") as f:
            f.write(f"{os.getpid()}\n")
        if mode == "kill":
            time.sleep(3600)
        else:
            with open(fifo + ".go") as go:
                go.readline()
            hog = bytearray()
            for _ in range(64):  # 64 x 32 MiB, every page touched
                hog += b"\1" * (32 << 20)
    return i * i


if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(pool.map(task, range(4)), flush=True)

"""Jobs that run slow for a reason the speed rules must name (tests/integration/test_speed.py).

  steps SWITCH   heartbeat steps at 10/s (a step every 0.1 s, paced by the clock, a little CPU work in
                 each), then every 0.3 s once the file SWITCH exists: a 3x slowdown whatever the load
  stalls [S N]   heartbeat steps at 10/s, standing still S seconds (default 6) every N steps (default 50)
                 in save_checkpoint (a checkpoint's pause)
  spin [N]       N processes (default 1) that burn CPU until killed
  quota DIR      put itself into the cpu cgroup DIR (root), then spin
  thrash FILE    hold 24 MiB, then read FILE (larger than what a 64 MiB limit leaves for the page cache)
                 again and again: the pages of each pass were evicted by the pass before
  io DIR FILE    put itself into the blkio cgroup DIR (root), then read FILE again and again, dropping it
                 from the page cache before each pass: every read waits on the (throttled) disk
Each writes "ready" to stdout once it runs as it should.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import jobwarden


def burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def spin_forever() -> None:
    while True:
        pass


def steps(switch: str) -> None:
    step = 0
    print("ready", flush=True)
    due = time.monotonic()
    while True:
        due += 0.3 if os.path.exists(switch) else 0.1
        burn(0.01)
        time.sleep(max(due - time.monotonic(), 0.0))
        step += 1
        jobwarden.heartbeat(step=step)


def save_checkpoint(seconds: float) -> None:
    time.sleep(seconds)  # the pause periodic-stall must name: this function (the shim dumps it in the pause)


def stalls(seconds: float, every: int) -> None:
    step = 0
    print("ready", flush=True)
    while True:
        if step and step % every == 0:
            save_checkpoint(seconds)
        else:
            time.sleep(0.1)
        step += 1
        jobwarden.heartbeat(step=step)


def spin(n: int) -> None:
    for _ in range(n - 1):
        multiprocessing.Process(target=spin_forever, daemon=True).start()
    print("ready", flush=True)
    spin_forever()


def read_forever(path: str) -> None:
    print("ready", flush=True)
    while True:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)


def thrash(path: str) -> None:
    held = bytearray(24 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    fd = os.open(path, os.O_RDONLY)  # its pages are charged to whoever read them first: drop them
    os.fsync(fd)  # a dirty page is not dropped
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    print("ready", flush=True)
    while True:
        with open(path, "rb") as fh:
            while fh.read(1 << 20):
                pass


def main() -> None:
    mode = sys.argv[1]
    if mode == "steps":
        steps(sys.argv[2])
    elif mode == "stalls":
        stalls(
            float(sys.argv[2]) if len(sys.argv) > 2 else 6.0, int(sys.argv[3]) if len(sys.argv) > 3 else 50
        )
    elif mode == "spin":
        spin(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    elif mode == "thrash":
        thrash(sys.argv[2])
    elif mode == "io":
        with open(os.path.join(sys.argv[2], "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        read_forever(sys.argv[3])
    elif mode == "quota":
        with open(os.path.join(sys.argv[2], "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        spin(1)


if __name__ == "__main__":
    main()

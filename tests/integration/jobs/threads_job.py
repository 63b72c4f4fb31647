"""Jobs whose own threads or workers cost them time (tests/integration/test_speed.py, worker-respawn and
gil-bound; research/slowness.md 2.13, 2.14, 5.7).

  gil            two Python threads that spin: they take turns on the GIL, one CPU in all
  matmul         torch matmuls with 2 intra-op threads (they release the GIL): two CPUs when free
  loader P       a torch DataLoader, spawn context, 2 workers, persistent_workers=P (0/1), epoch after
                 epoch; prints "epoch N" after each
The first two heartbeat step = tenths of a second since they started (the test's clock); each writes
"ready" to stdout once it runs as it should.
"""

from __future__ import annotations

import sys
import threading
import time

import jobwarden


def spin() -> None:
    n = 0
    while True:
        n += 1


def clock(start: float) -> None:
    jobwarden.heartbeat(step=int(10 * (time.monotonic() - start)))


def gil() -> None:
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    print("ready", flush=True)
    start = time.monotonic()
    while True:  # the main thread sleeps (it is not a third busy thread): it only says how long it ran
        time.sleep(0.5)
        clock(start)


def matmul() -> None:
    import torch

    torch.set_num_threads(2)
    a = torch.rand(384, 384)
    print("ready", flush=True)
    start = time.monotonic()
    while True:
        for _ in range(20):
            a = torch.mm(a, a).clamp_(0, 1)
        clock(start)


class Items:
    """A map-style dataset whose items take a little time in the worker."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> int:
        time.sleep(0.05)
        return i


def loader(persistent: bool) -> None:
    from torch.utils.data import DataLoader

    data = DataLoader(
        Items(), batch_size=4, num_workers=2, multiprocessing_context="spawn", persistent_workers=persistent
    )
    print("ready", flush=True)
    step = epoch = 0
    while True:
        for _ in data:
            step += 1
            jobwarden.heartbeat(step=step)
        epoch += 1
        print(f"epoch {epoch}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "gil":
        gil()
    elif what == "matmul":
        matmul()
    elif what == "loader":
        loader(sys.argv[2] == "1")
    else:
        sys.exit(f"threads_job: unknown job {what!r}")

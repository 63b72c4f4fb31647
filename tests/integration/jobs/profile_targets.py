"""Jobs to profile: `spin READY` burns CPU in burn_cpu() (one thread, or `spin READY N` with N idle
threads beside it); `dataloader READY` feeds a training loop from a torch DataLoader with two workers whose
dataset burns CPU in __getitem__; `dstate READY LIB` has a thread in D state beside a spinning one.
Each writes a line to READY once it is at work, then runs until killed."""

from __future__ import annotations

import sys
import threading


def burn_cpu() -> None:
    x = 0
    while True:
        for k in range(10000):
            x = (x + k * k) % 1000003


def spin(ready: str, idle_threads: int = 0) -> None:
    stop = threading.Event()
    for _ in range(idle_threads):
        threading.Thread(target=stop.wait, daemon=True).start()
    with open(ready, "w") as fh:
        fh.write("spinning\n")
    burn_cpu()


def dataloader(ready: str) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Burning(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, i: int) -> torch.Tensor:
            x = 0
            for k in range(20000):
                x = (x + k * k) % 1000003
            return torch.tensor([float(x)])

    told = False
    for batch in DataLoader(Burning(), batch_size=4, num_workers=2):
        batch.sum()
        if not told:
            with open(ready, "w") as fh:
                fh.write("loading\n")
            told = True


def dstate(ready: str, library: str) -> None:
    """A thread parked in D state (a vfork parent waits uninterruptibly for its child, which pauses:
    research/hang-diagnosis.md §1.6), while the main thread spins."""
    import ctypes

    lib = ctypes.CDLL(library)
    threading.Thread(target=lib.park_in_vfork, name="parked", daemon=True).start()
    with open(ready, "w") as fh:
        fh.write("parked\n")
    burn_cpu()


if __name__ == "__main__":
    if sys.argv[1] == "spin":
        spin(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    elif sys.argv[1] == "dstate":
        dstate(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "dataloader":
        dataloader(sys.argv[2])
    else:
        raise SystemExit(f"unknown target {sys.argv[1]!r}")

"""A training loop fed by a DataLoader, for the data-loading speed rules (tests/integration/test_speed.py).

  main      a Dataset whose __getitem__ burns CPU, num_workers=0: the loop loads its own batches
  workers   the same with one worker and a trivial model step: the loop waits on the worker
  keepsup   one worker, a cheap __getitem__ and a heavier model step: the DataLoader keeps up, until the
            file named by the second argument appears: then __getitem__ turns heavy and the model step
            trivial (the loop waits on its worker from then on)

Prints "ready" once the first batch went through, then trains until stopped."""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Burning(Dataset[torch.Tensor]):
    def __init__(self, work: int, heavier: str | None = None) -> None:
        self.work, self.heavier = work, heavier

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        x = 0
        work = 20000 if self.heavier and os.path.exists(self.heavier) else self.work
        for k in range(work):  # pure-Python decoding/augmentation stand-in
            x = (x * 31 + k) % 1000003
        return torch.full((64,), float(x % 7))


def main() -> None:
    mode = sys.argv[1]
    torch.set_num_threads(1)
    heavy = mode == "keepsup"
    flip = sys.argv[2] if heavy else None
    loader = DataLoader(
        Burning(200 if heavy else 20000, flip),
        batch_size=8,
        num_workers=0 if mode == "main" else 1,
        persistent_workers=mode != "main",
    )
    weight = torch.randn(64, 512 if heavy else 4)
    big = torch.randn(384, 384)
    first = True
    for batch in loader:
        y = batch @ weight
        if heavy and not (flip and os.path.exists(flip)):
            for _ in range(8):
                big = torch.tanh(big @ big / 384)
        y.sum().item()
        if first:
            print("ready", flush=True)
            first = False


if __name__ == "__main__":
    main()

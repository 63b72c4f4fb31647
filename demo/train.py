"""A pretend training run with two classic faults: a background prefetcher that escapes its process
group (setsid + double fork, the way some data loaders and loggers daemonize), and a bad batch that
crashes the trainer with an uncaught exception."""

import os
import subprocess
import sys
import time


def start_prefetcher() -> None:
    if os.fork() == 0:
        os.setsid()  # new session: killpg on the trainer's group would miss it
        subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        os._exit(0)
    os.wait()


def train_step(step: int) -> float:
    if step == 4:
        batch = {"input": [1.0, 2.0]}
        return batch["labels"][0]  # the bad batch: no labels
    time.sleep(0.2)
    return 1.0 / (step + 1)


start_prefetcher()
for step in range(10):
    print(f"step {step} loss {train_step(step):.3f}", flush=True)

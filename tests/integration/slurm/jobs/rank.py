"""One rank of a Slurm test job. It writes `ready-<SLURM_PROCID>` into $READY_DIR (the test's handshake),
holding the Slurm job id, then waits quietly (no output, no CPU) until a signal:

- SIGTERM: prints "rank N stopping" and exits 143, unless N is $IGNORE_TERM (that rank ignores SIGTERM and
  must be SIGKILLed);
- SIGUSR1 (a checkpoint request): prints "rank N got SIGUSR1", writes `usr1-N` into $READY_DIR and runs on
  for a moment, prints "rank N ran on" and exits 0.
"""

import os
import signal
import sys
import time
from pathlib import Path

rank = os.environ.get("SLURM_PROCID", "?")
ready = Path(os.environ["READY_DIR"])
got_usr1 = False


def on_term(signum: int, frame: object) -> None:
    print(f"rank {rank} stopping", flush=True)
    sys.exit(143)


def on_usr1(signum: int, frame: object) -> None:
    global got_usr1
    got_usr1 = True


signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE_TERM") == rank else on_term)
signal.signal(signal.SIGUSR1, on_usr1)
(ready / f"ready-{rank}").write_text(os.environ.get("SLURM_JOB_ID", ""))
while not got_usr1:
    time.sleep(0.05)
print(f"rank {rank} got SIGUSR1", flush=True)
(ready / f"usr1-{rank}").write_text(str(os.getpid()))
time.sleep(0.5)  # runs on after the signal, as a checkpoint would
print(f"rank {rank} ran on", flush=True)

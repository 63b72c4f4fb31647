"""A rank of the Ray tests' jobs. Its mode is picked by NODE_RANK (0 outside jobwarden.ray) from a
comma-separated list: `exit:N` exits N, `raise` raises, `hang` says it is up on READY_DIR/ready-RANK (a
FIFO) and waits for a signal; a SIGTERM is answered with a line and exit 143, as a checkpointing job would.
`stubborn` is `hang` ignoring SIGTERM: only a SIGKILL ends it. `raise-after-0` raises once rank 0 is up
(it reads rank 0's FIFO).

usage: rank.py MODES [READY_DIR]
"""

import os
import signal
import sys

rank = int(os.environ.get("NODE_RANK", "0"))
modes = sys.argv[1].split(",")
mode = modes[rank % len(modes)]
print(f"rank {rank} up: {mode}, marker {os.environ.get('RAY_TEST_MARK')}", flush=True)


def on_term(signum, frame):
    print(f"rank {rank}: SIGTERM, saving a checkpoint", flush=True)
    sys.exit(143)


if mode.startswith("exit:"):
    sys.exit(int(mode[5:]))
if mode == "raise-after-0":
    with open(os.path.join(sys.argv[2], "ready-0")) as peer:
        print(f"rank {rank}: rank 0 is up as pid {peer.readline().strip()}", flush=True)
    mode = "raise"
if mode == "raise":
    raise ValueError(f"rank {rank} failed on purpose")
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else on_term)
with open(os.path.join(sys.argv[2], f"ready-{rank}"), "w") as ready:
    ready.write(f"{os.getpid()}\n")
while True:
    signal.pause()

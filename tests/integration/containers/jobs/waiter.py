"""A job that waits quietly (no output, no CPU) for a signal, as a training step blocked on I/O would.

usage: waiter.py exit|ignore|none
It writes its pid to /t/ready (a FIFO: the test's handshake), then waits. On SIGTERM:
exit:   its handler runs (a checkpoint): prints "checkpoint saved", writes /t/term, exits 0;
ignore: it ignores SIGTERM, and must be SIGKILLed;
none:   no handler: SIGTERM ends it (143).
SIGUSR1 prints "got SIGUSR1" and it waits on.
"""

import os
import signal
import sys
import time

mode = sys.argv[1]


def on_term(signum: int, frame: object) -> None:
    print("checkpoint saved", flush=True)
    with open("/t/term", "w") as f:
        f.write(str(os.getpid()))
    sys.exit(0)


def on_usr1(signum: int, frame: object) -> None:
    print("got SIGUSR1", flush=True)


if mode == "exit":
    signal.signal(signal.SIGTERM, on_term)
elif mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, on_usr1)
with open("/t/ready", "w") as ready:
    ready.write(f"{os.getpid()}\n")
while True:
    time.sleep(3600)

"""A job that starts the five kinds of descendants, reports their pids on a FIFO, then waits or exits.

usage: descendants.py FIFO wait|exit
"""

import os
import subprocess
import sys
import time

fifo, mode = sys.argv[1], sys.argv[2]
SLEEP = ["sleep", "3600"]
pids = {}
pids["plain"] = subprocess.Popen(SLEEP).pid
pids["setsid"] = subprocess.Popen(SLEEP, start_new_session=True).pid


def double_fork(new_session: bool) -> int:
    """Fork a child that starts a grandchild and exits at once: the grandchild is reparented."""
    r, w = os.pipe()
    if os.fork() == 0:
        if new_session:
            os.setsid()
        grandchild = subprocess.Popen(SLEEP).pid
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32))
    os.close(r)
    os.wait()
    return pid


pids["double_fork_setsid"] = double_fork(True)
pids["double_fork"] = double_fork(False)
pids["interpreter"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]).pid
with open(fifo, "w") as fh:
    fh.write(" ".join(f"{k}={v}" for k, v in pids.items()) + "\n")
if mode == "wait":
    while True:
        time.sleep(3600)

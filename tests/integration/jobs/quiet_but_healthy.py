"""Jobs that print nothing for longer than the hang window, yet are healthy: no hang may be reported.

usage: quiet_but_healthy.py cpu|heartbeat|disk|child SECONDS
cpu:       computes, prints nothing
heartbeat: idle, but calls jobwarden.heartbeat() twice a second
disk:      reads a scratch file in small bursts, prints nothing, almost no CPU
child:     a sleeping child while the parent computes
"""

import os
import subprocess
import sys
import tempfile
import time

mode, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds


def compute() -> None:
    x = 0
    while time.monotonic() < end:
        x += sum(range(1000))


if mode == "cpu":
    compute()
elif mode == "heartbeat":
    import jobwarden

    step = 0
    while time.monotonic() < end:
        step += 1
        jobwarden.heartbeat(step=step)
        time.sleep(0.5)  # the job's own pace, not a test waiting
elif mode == "disk":
    with tempfile.TemporaryFile() as scratch:
        scratch.write(os.urandom(1 << 20))
        while time.monotonic() < end:
            scratch.seek(0)
            scratch.read()
            time.sleep(0.2)
elif mode == "child":
    child = subprocess.Popen(["sleep", str(seconds)])
    compute()
    child.wait()

"""A worker killed milliseconds after it was born; its parent then exits with code 1, as a pool would.

usage: early_death.py fork|spawn|exec DELAY_MS

fork and spawn start a multiprocessing.Process (the parent reaps it with join()); exec starts a program
that is not Python (`sh`), killed the same way. The parent prints `worker PID` so the test knows whom
jobwarden must name. Every run ends by itself.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import time


def idle() -> None:
    time.sleep(30)


def main() -> int:
    how, delay_ms = sys.argv[1], float(sys.argv[2])
    if how == "exec":
        child = subprocess.Popen(["sh", "-c", "sleep 30"])
        pid, wait = child.pid, child.wait
    else:
        worker = multiprocessing.get_context(how).Process(target=idle)
        worker.start()
        pid, wait = worker.pid, worker.join  # type: ignore[assignment]
    print(f"worker {pid}", flush=True)
    time.sleep(delay_ms / 1000)
    os.kill(pid, signal.SIGKILL)
    wait()
    print("the worker died: giving up", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""The S2 seed case: fork while another thread holds a lock; the child waits for it forever.

usage: fork_deadlock.py FIFO mp|os
A 'holder' thread takes the lock and keeps it; the main thread forks (through multiprocessing's fork
context, or os.fork); the child takes the same lock, which was copied in its held state, and never gets
it. The child's pid is written to FIFO once it exists.
"""

import multiprocessing
import os
import sys
import threading

fifo, mode = sys.argv[1], sys.argv[2]
lock = threading.Lock()
held = threading.Event()


def holder() -> None:
    with lock:
        held.set()
        threading.Event().wait()  # keeps the lock for ever


def child_work() -> None:
    with lock:  # copied in the held state: nobody in this process will ever release it
        print("unreachable", flush=True)


threading.Thread(target=holder, name="lock-holder", daemon=True).start()
held.wait()
if mode == "mp":
    worker = multiprocessing.get_context("fork").Process(target=child_work, name="fork-child")
    worker.start()
    pid = worker.pid
else:
    pid = os.fork()
    if pid == 0:
        child_work()
        os._exit(0)
with open(fifo, "w") as f:
    f.write(f"{pid}\n")
if mode == "mp":
    worker.join()
else:
    os.waitpid(pid, 0)

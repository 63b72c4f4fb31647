"""A job that starts its own Ray (its raylet is a process of the job: started from Python, exec()ed into its
binary), loses a worker, then needs the raylet again. jobwarden takes the stacks of a lost worker's parent,
the raylet: its dump signal used to kill it ("The task's local raylet died").

usage: local_cluster.py [FILE]   with FILE, the worker writes its pid there before it exits 3, and the
driver does not catch the WorkerCrashedError: the job fails, and its verdict must name the worker."""

import os
import sys

import ray

PID_FILE = sys.argv[1] if len(sys.argv) > 1 else None

os.environ.pop("RAY_ADDRESS", None)  # a cluster of its own, whatever the environment names
ray.init(address="local", num_cpus=1, include_dashboard=False)


@ray.remote(max_retries=0)
def dies() -> None:
    if PID_FILE:
        with open(PID_FILE, "w") as f:
            f.write(str(os.getpid()))
    os._exit(3)


@ray.remote
def answers() -> int:
    return 42


if PID_FILE:
    ray.get(dies.remote())  # WorkerCrashedError, uncaught: the driver reports the worker's death
try:
    ray.get(dies.remote())
except ray.exceptions.WorkerCrashedError:
    print("the worker crashed", flush=True)
print("then:", ray.get(answers.remote(), timeout=120), flush=True)

"""A job that starts its own Ray (its raylet is a process of the job: started from Python, exec()ed into its
binary), loses a worker, then needs the raylet again. jobwarden takes the stacks of a lost worker's parent,
the raylet: its dump signal used to kill it ("The task's local raylet died")."""

import os

import ray

os.environ.pop("RAY_ADDRESS", None)  # a cluster of its own, whatever the environment names
ray.init(address="local", num_cpus=1, include_dashboard=False)


@ray.remote(max_retries=0)
def dies() -> None:
    os._exit(3)


@ray.remote
def answers() -> int:
    return 42


try:
    ray.get(dies.remote())
except ray.exceptions.WorkerCrashedError:
    print("the worker crashed", flush=True)
print("then:", ray.get(answers.remote(), timeout=120), flush=True)

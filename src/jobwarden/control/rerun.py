"""`jobwarden rerun JOB`: the same command, working directory, `--env` values and options, as a new job
that says where it came from (`rerun_of`, in `status` and its JSON). The remedy "run it again" is then
one command.

What is not the job's own is today's, as for any `run`: the environment it inherits (the rerunning
shell's, plus the stored `--env` values) and where it runs. A rerun always runs on its own, detached:
one started inside Slurm or Ray was that engine's task, and this shell is not.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from jobwarden.control.launch import Launched, launch
from jobwarden.errors import UsageError
from jobwarden.model import JobSpec
from jobwarden.store import JobRecord, Store


def rerun(home: Path, job_ref: str) -> tuple[Launched, JobRecord]:
    """Start the job named by `job_ref` again; returns the new job and the one it repeats."""
    with Store(home) as store:
        old = store.job(job_ref)
    if not os.path.isdir(old.cwd):
        raise UsageError(
            f"cannot rerun job {old.id}: its working directory {old.cwd} is gone",
            f"make it again, or run the command anew: jobwarden run --cwd DIR -- {shlex.join(old.command)}",
        )
    spec = JobSpec(command=old.command, cwd=old.cwd, name=old.name, env=old.env)
    options = old.options._replace(engine=None, engine_budget_s=None)
    if options.wants_gpus:
        from jobwarden.control.gpurequest import refuse_impossible_gpus

        refuse_impossible_gpus(options)
    return launch(home, spec, options, rerun_of=old.id), old

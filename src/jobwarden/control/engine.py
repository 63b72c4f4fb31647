"""Which engine a `run` is inside (Slurm, Ray, a container, none), and what it says about the run's place
in a distributed job: its group, attempt, rank and node. Read from the environment the engine sets for a
task (docs/cluster.md) and, for a container, the marker files its runtime leaves (osapi.container);
nothing here starts a process."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import NamedTuple

from jobwarden.errors import UsageError
from jobwarden.osapi.container import ContainerFacts, container_facts

ENGINES = ("auto", "slurm", "ray", "container", "none")
# Ray Jobs sets this (runtime env and metadata, the submission id among them) for its entrypoint only; the
# raylet sets RAY_RAYLET_PID for its workers (tasks, actors). Neither sets RAY_JOB_ID for an entrypoint.
RAY_JOBS_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
RAY_WORKER_VAR = "RAY_RAYLET_PID"


class EnginePlace(NamedTuple):
    """Where a run sits in its engine; None fields are unknown (or not in an engine at all)."""

    engine: str | None  # "slurm" | "ray" | "container" | None
    group: str | None
    attempt: int
    rank: int | None
    node: str | None


def detect_engine(asked: str, env: Mapping[str, str], container: ContainerFacts | None = None) -> str | None:
    """--engine: "auto" finds Slurm by its step variables, Ray by what it sets for a Jobs entrypoint or a
    worker (a driver started by hand has neither: --engine ray), a container when `run` is its main
    process (DESIGN "In a container"); "none" forces a plain run. Slurm and Ray come first: under pyxis or
    KubeRay the container is theirs, and so are the signals."""
    if asked not in ENGINES:
        raise UsageError(f"--engine {asked!r}: not one of {', '.join(ENGINES)}", "e.g. --engine slurm")
    if asked == "auto":
        if env.get("SLURM_STEP_ID") or env.get("SLURM_JOB_ID"):
            return "slurm"
        if env.get(RAY_JOBS_VAR) or env.get(RAY_WORKER_VAR):
            return "ray"
        return "container" if container_entrypoint(env, container) else None
    return None if asked == "none" else asked


def container_entrypoint(env: Mapping[str, str], facts: ContainerFacts | None = None) -> bool:
    """In a container (its markers, or PID 1 of a pid namespace) and its main process: PID 1, or the child
    of the init the runtime put first (`--init`'s tini or catatonit, an entrypoint script). Only then does
    the container live as long as `run` does. A run typed in a shell inside a container (a notebook, `docker
    exec -it ... bash`, a CI job in a pod) is a plain, detached run, as on a workstation."""
    facts = facts if facts is not None else container_facts(env)
    return facts.inside and facts.main_process


def engine_place(engine: str | None, env: Mapping[str, str]) -> EnginePlace:
    """The defaults an engine gives a run's --group, attempt, --rank and node."""
    if engine == "ray":
        submission = ray_submission_id(env)
        return EnginePlace(engine, f"ray-{submission}" if submission else None, 0, None, None)
    if engine != "slurm":
        return EnginePlace(engine, None, 0, None, None)
    return EnginePlace(
        engine,
        slurm_group(env),
        _whole(env.get("SLURM_RESTART_COUNT")) or 0,
        _whole(env.get("SLURM_PROCID")),
        env.get("SLURMD_NODENAME") or None,
    )


def slurm_group(env: Mapping[str, str]) -> str | None:
    """One group per Slurm job (and per task of an array): every rank of every step of it meets there;
    the cluster's name keeps two clusters sharing one home apart."""
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if not job:
        return None
    cluster = env.get("SLURM_CLUSTER_NAME")
    return f"slurm-{cluster}-{job}" if cluster else f"slurm-{job}"


def ray_submission_id(env: Mapping[str, str]) -> str | None:
    """The Ray Jobs submission id (`raysubmit_...`, or the one given to `ray job submit
    --submission-id`) of the entrypoint whose environment this is; None outside one."""
    try:
        config = json.loads(env.get(RAY_JOBS_VAR) or "{}")
        submission = config.get("metadata", {}).get("job_submission_id")
    except (ValueError, AttributeError):  # not Ray's JSON: no id rather than a failed run
        return None
    return str(submission) if submission else None


def _whole(text: str | None) -> int | None:
    return int(text) if text and text.isdecimal() else None

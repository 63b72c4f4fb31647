"""`cancelled-by-engine`: the run was ended by the engine it ran in (Slurm's scancel, time limit or
preemption; `ray job stop`), not by the user through jobwarden and not by a fault of its own. The shim
recorded the engine's signal and, under Slurm, the job's state as scontrol gave it; the remedy follows
from that state."""

from __future__ import annotations

from jobwarden.clock import shown_time
from jobwarden.model import Finding
from jobwarden.rules.evidence import RunEvidence, job_ref

_SLURM_TITLES = {
    "CANCELLED": "Cancelled by Slurm (scancel)",
    "TIMEOUT": "Ended by Slurm at the job's time limit",
    "PREEMPTED": "Preempted by Slurm",
    "NODE_FAIL": "Ended by Slurm: a node of the job failed",
    "DEADLINE": "Ended by Slurm at the job's deadline",
}
_REMEDIES = {
    "TIMEOUT": "ask for more time (sbatch/srun --time), or save a checkpoint before the limit: "
    "sbatch --signal=USR1@120 with a SIGUSR1 handler in the job (jobwarden forwards SIGUSR1 to it), "
    "and resume from the checkpoint in the next job",
    "PREEMPTED": "save a checkpoint on SIGTERM and resubmit with --requeue, so the job resumes when it is "
    "scheduled again",
    "CANCELLED": "nothing to fix if the cancel was meant (scancel by a user or an admin); `sacct -j {job} "
    "-o JobID,State,Reason` says who",
}


def engine_stop(ev: RunEvidence) -> Finding | None:
    if ev.end_reason != "engine-stop":
        return None
    engine = {"slurm": "Slurm", "ray": "Ray", "container": "the container's runtime"}.get(
        ev.engine or "", "the engine"
    )
    sig = ev.engine_signal or "a stop signal"
    when = f" at {_hms(ev.engine_signal_at)}" if ev.engine_signal_at else ""
    how = f"signal {ev.signal}" if ev.signal else f"exit code {ev.exit_code}"
    budget = f"{ev.engine_budget_s:g} s" if ev.engine_budget_s else "unknown"
    evidence = [f"{engine} sent {sig}{when}"]
    if ev.engine_state:
        reason = f", reason {ev.engine_reason}" if ev.engine_reason else ""
        evidence.append(f"Slurm job state {ev.engine_state}{reason}")
    evidence += [f"main process {ev.pid}: {how}", f"kill budget {budget} (SIGTERM -> SIGKILL)"]
    if "engine-stop" in ev.stack_triggers:
        evidence.append(f"the job's stacks were stored first: `jobwarden dump {job_ref(ev)}` shows them")
    return Finding(
        "cancelled-by-engine",
        _title(engine, ev),
        f"{engine} sent {sig}{when} to the job's task; jobwarden ended the job inside {engine}'s kill "
        f"budget ({budget}) and recorded its end. The main process ended with {how}.",
        "error" if ev.engine_state in ("TIMEOUT", "NODE_FAIL") else "warning",
        tuple(evidence),
        _remedy(engine, ev),
        (ev.pid,) if ev.pid else (),
    )


def _title(engine: str, ev: RunEvidence) -> str:
    if engine == "Slurm" and ev.engine_state in _SLURM_TITLES:
        return _SLURM_TITLES[ev.engine_state]
    if engine == "Ray":
        return "Stopped by Ray (`ray job stop`, or its driver or actor ended)"
    if ev.engine == "container":
        return "Stopped by the container's runtime (docker stop, podman stop, the pod deleted or evicted)"
    return f"Stopped by {engine}"


def _remedy(engine: str, ev: RunEvidence) -> str:
    if ev.engine == "container":
        return _container_remedy(ev)
    slurm_job = ev.engine_job or "<its Slurm job id>"
    remedy = _REMEDIES.get(ev.engine_state or "", "").replace("{job}", slurm_job)
    if not remedy:
        remedy = (
            "nothing to fix if the stop was meant; under Slurm, "
            f"`sacct -j {slurm_job} -o JobID,State,Reason` says why (a time limit: --signal=USR1@120 and "
            "a checkpoint handler, or a longer --time)"
            if engine != "Ray"
            else "nothing to fix if the stop was meant; give the job longer to stop with a larger "
            "RAY_JOB_STOP_WAIT_TIME_S"
        )
    if ev.signal == "SIGKILL":  # it outlived the grace that fits the budget
        knob = (
            "RAY_JOB_STOP_WAIT_TIME_S" if engine == "Ray" else "KillWait in slurm.conf (an admin's setting)"
        )
        remedy += (
            f"; the job did not end on SIGTERM within the grace that fits the kill budget: make its "
            f"SIGTERM handler faster, or raise {knob}"
        )
    return remedy


def _container_remedy(ev: RunEvidence) -> str:
    remedy = (
        "nothing to fix if the stop was meant; on Kubernetes `kubectl describe pod` and the pod's events say "
        "why (deleted, evicted, preempted, a node drained): save a checkpoint on SIGTERM and let the Job's "
        "podFailurePolicy retry it"
    )
    if ev.signal == "SIGKILL":
        remedy += (
            "; the job did not end on SIGTERM within the grace that fits the stop timeout: make its SIGTERM "
            "handler faster, or raise the stop timeout (docker run --stop-timeout, the pod's "
            "terminationGracePeriodSeconds) and JOBWARDEN_STOP_TIMEOUT with it"
        )
    return remedy


def _hms(at: float) -> str:
    return shown_time(at, "time")

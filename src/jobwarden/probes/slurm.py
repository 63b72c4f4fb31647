"""What Slurm says about the job a run is part of: its kill budget (KillWait) and, once it stops the job,
why (the job's state: CANCELLED, TIMEOUT, PREEMPTED...). Asked through `scontrol` with a deadline; every
answer is optional: a cluster that does not answer costs a default, never the run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from jobwarden.config import DEFAULT_ENGINE_BUDGET_S
from jobwarden.errors import OsApiError
from jobwarden.osapi.tool import run_tool

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"  # where Debian's slurm-wlm reads it without SLURM_CONF
_KILL_WAIT = re.compile(r"^KillWait\s*=\s*(\d+)\s*sec", re.MULTILINE)
_FIELD = re.compile(r"(?:^|\s)(JobState|Reason)=(\S+)")


class SlurmJobState(NamedTuple):
    state: str  # why it ends: "CANCELLED", "TIMEOUT", "PREEMPTED"... (or "RUNNING": it does not)
    reason: str | None  # Slurm's Reason= ("None" is None)
    shown: str  # JobState= as scontrol showed it: "COMPLETING" while the job's processes end


# While its processes end, a stopped job shows JobState=COMPLETING (22.05), its end state hidden until
# then; the Reason tells a time limit (Reason=TimeLimit, observed) from a scancel (Reason=None, observed).
_ENDED_BY_REASON = {
    "TimeLimit": "TIMEOUT",
    "Deadline": "DEADLINE",
    "NodeDown": "NODE_FAIL",
    "Preemption": "PREEMPTED",  # not verified here: no preemption in the test cluster
}


def parse_kill_wait(config_text: str) -> float | None:
    """KillWait from `scontrol show config` ("KillWait                = 5 sec")."""
    found = _KILL_WAIT.search(config_text)
    return float(found.group(1)) if found else None


def parse_job_state(job_text: str) -> SlurmJobState | None:
    """Why the job ends, from JobState and Reason of `scontrol show job -o ID`."""
    fields = dict(_FIELD.findall(job_text))
    if "JobState" not in fields:
        return None
    shown, reason = fields["JobState"], fields.get("Reason")
    reason = None if reason in (None, "None") else reason
    state = shown
    if shown == "COMPLETING":
        state = _ENDED_BY_REASON.get(reason or "", "CANCELLED")
    return SlurmJobState(state, reason, shown)


def kill_wait_s(env: Mapping[str, str], timeout_s: float = 3.0) -> float | None:
    """The cluster's KillWait: how long after its SIGTERM Slurm sends SIGKILL. Read from slurm.conf when
    it says all (about 0.1 ms), else asked from scontrol (14 ms of every attached `srun`, measured); None
    when neither answers in time."""
    text = _read_config(Path(env.get("SLURM_CONF") or DEFAULT_SLURM_CONF))
    if text is not None:
        from_file = config_kill_wait(text)
        if from_file is not None:
            return from_file
    text = _scontrol(["show", "config"], env, timeout_s)
    return parse_kill_wait(text) if text is not None else None


def config_kill_wait(conf_text: str) -> float | None:
    """KillWait as slurm.conf sets it (keys are case-insensitive; Slurm's default when unset), or None
    when the file alone cannot say: it includes other files, which may set it."""
    kill_wait = DEFAULT_ENGINE_BUDGET_S  # Slurm's own default KillWait
    for raw in conf_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, _, value = line.partition("=")
        if line.lower().startswith("include"):
            return None
        if key.strip().lower() == "killwait" and value.strip().isdecimal():
            kill_wait = float(value.strip())
    return kill_wait


def _read_config(path: Path) -> str | None:
    """slurm.conf's text; None when it is not there (a "configless" cluster: scontrol knows)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return None


def job_state(env: Mapping[str, str], timeout_s: float) -> SlurmJobState | None:
    """The state of the Slurm job this process runs in ($SLURM_JOB_ID), when scontrol answers in time."""
    job = env.get("SLURM_JOB_ID")
    if not job or not job.isdecimal() or timeout_s <= 0:
        return None
    text = _scontrol(["show", "job", "-o", job], env, timeout_s)
    return parse_job_state(text) if text is not None else None


def _scontrol(args: list[str], env: Mapping[str, str], timeout_s: float) -> str | None:
    try:
        result = run_tool(["scontrol", *args], timeout_s, env=env)
    except OsApiError:
        return None
    if result.returncode != 0:
        return None
    return result.stdout.decode("utf-8", "replace")

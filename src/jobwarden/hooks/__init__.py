"""The Python hooks: the environment that makes every Python process of a job load them.

The hooks themselves (`site/sitecustomize.py`, `fallback/jobwarden`) run inside the job's interpreter, any
CPython 3.8-3.14, and import nothing from here; this side runs in jobwarden. `probes.pyhooks` reads what the
hooks record under the py dir:

    <pid>.json          the advert: this process handles the fault signal, dumps to fault_file (a memfd,
                        /proc/PID/fd/N, while descriptor N is still it), and the fork it was forked under
    <pid>.stacks        faulthandler's dumps where memfd_create is refused, appended, one per signal
    <pid>.forks.jsonl   the first forks made at each call site while other threads ran, then a count
    <pid>.fr.req        a FIFO a torch.distributed rank reads on a thread of the hooks: each byte the shim
                        writes there asks for PyTorch's flight recorder
    <pid>.fr.json       the recorder's last entries, as that thread last wrote them (probes.flightrec)
    <pid>.fr.poll.json  when the rank called its last collectives, as it answered the shim's last poll
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

from jobwarden.errors import UsageError

SITE_DIR = Path(__file__).resolve().parent / "site"
FALLBACK_DIR = Path(__file__).resolve().parent / "fallback"

PY_DIR_ENV = "JOBWARDEN_PY_DIR"
FAULT_SIGNAL_ENV = "JOBWARDEN_FAULT_SIGNAL"
SHIM_PID_ENV = "JOBWARDEN_SHIM_PID"
HEARTBEAT_FILE_ENV = "JOBWARDEN_HEARTBEAT_FILE"
MP_START_ENV = "JOBWARDEN_MP_START"
MP_START_METHODS = ("spawn", "forkserver")

# A real-time signal, not SIGUSR1/2: SLURM (--signal), torchelastic and training scripts install their own
# SIGUSR handlers (checkpoint, requeue), which faulthandler would replace (chain=False) or trigger
# (chain=True). Nothing claims SIGRTMIN+6; glibc keeps 32 and 33 below SIGRTMIN for itself. The default
# action of a real-time signal is to terminate, so the shim sends it only to a process whose advert and
# SigCgt say it is handled.
FAULT_SIGNAL = int(signal.SIGRTMIN) + 6

# PyTorch's flight recorder keeps the last N collectives of each rank (gloo and NCCL alike since 2026: the
# first name; the second is what older releases read, NCCL only). jobwarden reads it on a hang to name the
# rank the others wait for (rules.hang.desync), and polls it for when each rank called its collectives (the
# straggler: rules.speed.arrivals). Measured cost on a gloo all_reduce loop: docs/measurements.md, "Flight
# recorder". A user's own value, either name, wins: they may have sized it, or turned it off (0). 256: a
# hang's comparison reads the last 64, a poll the whole buffer, whose dump costs the rank 1.1 ms of CPU at
# 256 entries and 11 ms at 2,000.
FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_ENTRIES = "256"


def hook_env(
    py_dir: Path, heartbeat_file: Path, shim_pid: int, mp_start: str | None, base_env: Mapping[str, str]
) -> dict[str, str]:
    """The variables to add to (or override in) `base_env` so the job's Python processes load the hooks.

    The site dir goes first on PYTHONPATH, ahead of site-packages and the standard library, so that its
    sitecustomize is the one `site` imports (it then runs the one it shadows). The py dir must exist and be
    writable by the job (the hooks create it if they can)."""
    if mp_start is not None and mp_start not in MP_START_METHODS:
        raise UsageError(
            f"unknown start method {mp_start!r}", f"use --mp-start {' or '.join(MP_START_METHODS)}"
        )
    env = {
        "PYTHONPATH": _python_path(base_env.get("PYTHONPATH", "")),
        PY_DIR_ENV: str(py_dir.absolute()),
        FAULT_SIGNAL_ENV: str(FAULT_SIGNAL),
        SHIM_PID_ENV: str(shim_pid),
        **heartbeat_env(heartbeat_file),
    }
    if not any(name in base_env for name in FLIGHT_RECORDER_ENV):
        env.update(dict.fromkeys(FLIGHT_RECORDER_ENV, FLIGHT_RECORDER_ENTRIES))
    if mp_start is not None:
        env[MP_START_ENV] = mp_start
    elif base_env.get(MP_START_ENV):
        env[MP_START_ENV] = ""  # inherited from an outer job: empty means unset to the hooks
    return env


def heartbeat_env(heartbeat_file: Path) -> dict[str, str]:
    """What `jobwarden.heartbeat()` (or any program that touches the file) needs, hooks or not."""
    return {HEARTBEAT_FILE_ENV: str(heartbeat_file.absolute())}


def _python_path(existing: str) -> str:
    site = str(SITE_DIR)
    if not existing:
        return site
    # empty entries stay: they mean the current directory
    return os.pathsep.join([site, *(entry for entry in existing.split(os.pathsep) if entry != site)])

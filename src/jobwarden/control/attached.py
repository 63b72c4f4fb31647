"""`run` inside an engine (Slurm, Ray, a container): the CLI stays the engine's task until the job ends.

The engine signals its task, and with Slurm's proctrack/cgroup only its task: a CLI that died of the
signal would let slurmstepd SIGKILL the shim and the job a few milliseconds later, with no grace, no
stacks and no end recorded (docs/cluster.md). So the CLI catches the engine's signals and relays them to
its child, the shim (shim.run.enginestop says what the shim makes of each), copies the job's output to its
own stdout (the job itself still writes only to its log, never into a pipe), and exits once the shim has,
with the job's status.

A container's main process is the same task for its runtime (`docker stop`, the kubelet): its stop is the
engine's SIGTERM, and its stop timeout the kill budget. As the container's PID 1 the CLI is its init too,
and reaps every orphan of the namespace while it waits (osapi.container).
"""

from __future__ import annotations

import contextlib
import select
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from jobwarden import trace
from jobwarden.config import DEFAULT_ENGINE_BUDGET_S, parse_duration
from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import ProcessId
from jobwarden.osapi import asking, container
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.process import ENGINE_SIGNALS, RELAYED_USR1, signal_name
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import Layout
from jobwarden.store.logfiles import follow

RAY_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
RAY_DEFAULT_STOP_WAIT_S = 3.0  # Ray Jobs: SIGTERM, then SIGKILL this long after (docs/cluster.md)
# A container's stop timeout cannot be read from inside it (neither `docker run --stop-timeout` nor a pod's
# terminationGracePeriodSeconds reaches the container): said with this variable, else the runtimes' defaults
STOP_TIMEOUT_ENV = "JOBWARDEN_STOP_TIMEOUT"
DOCKER_STOP_TIMEOUT_S = 10.0  # `docker stop` and `podman stop`: SIGTERM, then SIGKILL 10 s later
KUBERNETES_GRACE_S = 30.0  # a pod's terminationGracePeriodSeconds by default
_FOLLOW_POLL_S = 0.1
# the shim's own SIGUSR1 means `jobwarden stop`: the engine's comes as RELAYED_USR1
_AS_RELAYED: dict[int, int] = {int(sig): int(sig) for sig in ENGINE_SIGNALS} | {signal.SIGUSR1: RELAYED_USR1}


def engine_budget_s(engine: str | None, env: Mapping[str, str]) -> float:
    """How long the engine waits between its SIGTERM and its SIGKILL: Slurm's KillWait (slurm.conf, or
    scontrol), Ray's RAY_JOB_STOP_WAIT_TIME_S (3 s by default), a container's stop timeout (see
    container_budget_s); 30 s when unknown."""
    if engine == "container":
        return container_budget_s(env)
    if engine == "ray":
        text = env.get(RAY_STOP_WAIT_ENV, "")
        with contextlib.suppress(ValueError):
            if float(text) > 0:
                return float(text)
        return RAY_DEFAULT_STOP_WAIT_S
    if engine == "slurm":
        from jobwarden.probes.slurm import kill_wait_s

        return kill_wait_s(env) or DEFAULT_ENGINE_BUDGET_S
    return DEFAULT_ENGINE_BUDGET_S


def container_budget_s(env: Mapping[str, str]) -> float:
    """The container's stop timeout: JOBWARDEN_STOP_TIMEOUT (seconds, or 30s, 2m), else Kubernetes' default
    grace in a pod, else Docker's and Podman's default stop timeout."""
    text = env.get(STOP_TIMEOUT_ENV)
    if text is not None:
        return parse_duration(text, STOP_TIMEOUT_ENV)
    return KUBERNETES_GRACE_S if env.get(container.KUBERNETES_ENV) else DOCKER_STOP_TIMEOUT_S


class SignalRelay:
    """Catches the engine's signals from before the shim exists (a signal then is held, and relayed once
    the shim's pid is known) until the CLI exits. SIGCONT (scancel sends it first) keeps its default."""

    def __init__(self) -> None:
        self.procfs = ProcFS()
        self.shim: ProcessId | None = None
        self.shim_pidfd: int | None = None
        self.held: list[int] = []

    def install(self) -> None:
        for sig in _AS_RELAYED:
            signal.signal(sig, self._caught)

    def attach(self, shim_pid: int) -> None:
        # our child, not reaped yet: the pidfd names it, and keeps naming it after follow_attached has
        # reaped it, when its pid may be another process's (an engine's signal can come that late)
        try:
            self.shim_pidfd = pidfds.open_pidfd(shim_pid)
            start_time = self.procfs.stat(shim_pid).start_time  # a zombie's too: then nothing is relayed
        except (ProcessGone, AccessDenied):
            return  # it has ended already: nothing to relay to
        self.shim = ProcessId(shim_pid, start_time)
        held, self.held = self.held, []
        for sig in held:
            self._relay(sig)

    def _caught(self, signum: int, frame: FrameType | None) -> None:
        if self.shim is None:
            self.held.append(signum)
        else:
            self._relay(signum)

    def _relay(self, signum: int) -> None:
        """Only while the shim catches the signal, or still blocks it (its handlers are on their way: it
        was forked with them blocked): uncaught, the relayed real-time signal would end it."""
        assert self.shim is not None and self.shim_pidfd is not None
        relayed = _AS_RELAYED[signum]
        with contextlib.suppress(AccessDenied):  # GONE (not sent) once the shim has exited
            answer = asking.ask_through(self.shim_pidfd, self.procfs, self.shim, relayed, blocked_ok=True)
            if answer is asking.Answer.NOT_CAUGHT:
                trace.info(f"not relayed {signal_name(relayed)} to the supervisor: {answer.value}")


def follow_attached(home: Path, job_id: int, run: int, shim_pid: int) -> None:
    """Copy the output of each run of the job to stdout until the shim has exited, then reap it. A
    restart (--restart) is a new run with its own log: followed in turn. As a container's init (PID 1)
    every orphan of the container is reaped on the way, within a poll (0.1 s) of its end."""
    pidfd = pidfds.open_pidfd(shim_pid)  # our child, not reaped yet: it cannot be gone
    init = container.is_init()
    layout = Layout(home)
    out = _Output()
    try:
        while True:

            def done(run: int = run) -> bool:
                exited = bool(select.select([pidfd], [], [], _FOLLOW_POLL_S)[0])
                if init:  # the shim among them, once it has exited: the pidfd still tells its end
                    container.reap_orphans()
                return exited or layout.output_log(job_id, run + 1).exists()

            for chunk in follow(layout.output_log(job_id, run), 0, done, poll_s=0):
                out.write(chunk)
            if select.select([pidfd], [], [], 0)[0]:
                break
            run += 1
        container.reap_through(pidfd)
    finally:
        pidfds.close(pidfd)


class _Output:
    """stdout, until it breaks (srun gone, a closed pipe): the CLI must outlive it, for the job's sake."""

    def __init__(self) -> None:
        self.broken = False

    def write(self, chunk: bytes) -> None:
        if self.broken:
            return
        try:
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        except (OSError, ValueError):
            self.broken = True

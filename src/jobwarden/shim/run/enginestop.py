"""An attached run's side of the engine it runs in (Slurm, Ray): the signals the CLI relays, and the engine
stop, spent inside the engine's kill budget.

The engine signals only its task, the `jobwarden run` CLI (Slurm's proctrack/cgroup), or the CLI, the shim
and the job at once (Ray). The CLI relays each signal to the shim (SIGUSR1 as RELAYED_USR1: the shim's own
SIGUSR1 means `jobwarden stop`). SIGTERM and SIGINT, relayed or the shim's own (its parent-death signal,
Ray's kill), are an engine stop; SIGUSR1/SIGUSR2/SIGHUP/SIGALRM go to the job's main process, which runs on
(a checkpoint before the time limit). Each is recorded as an `engine-signal` event.

The budget B is the time the engine gives between its SIGTERM and its SIGKILL (Slurm's KillWait, Ray's
stop wait): stacks first, quiet job or busy one ("where was it when the time limit hit?"), at most
min(5 s, B/4); then SIGTERM to the tree, a grace of min(--grace, B - elapsed - margin), SIGKILL, and the
end record, all before the engine's SIGKILL would take the shim with the job.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Mapping, Sequence

from jobwarden.config import DEFAULT_ENGINE_BUDGET_S
from jobwarden.errors import AccessDenied
from jobwarden.joboptions import JobOptions
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.process import ENGINE_SIGNALS, RELAYED_USR1, signal_name
from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.record.recorder import RunRecorder, log
from jobwarden.shim.tree.jobtree import Member
from jobwarden.store import Store

STACKS_CAP_S = 5.0
MIN_STACKS_S = 0.2  # less budget than this left for the stacks: none are taken
_STOP = frozenset({signal.SIGTERM, signal.SIGINT})
_FORWARD = frozenset({signal.SIGUSR2, signal.SIGHUP, signal.SIGALRM, RELAYED_USR1})
HANDLED = frozenset(ENGINE_SIGNALS - {signal.SIGUSR1}) | {RELAYED_USR1}
RELAYED_USR1_AS = {RELAYED_USR1: signal.SIGUSR1}


def engine_signals(link: EngineLink | None) -> tuple[int, ...]:
    """The signals an attached shim handles beyond its own (none for a detached one)."""
    return tuple(sorted(HANDLED)) if link is not None else ()


def stacks_cap_s(budget_s: float) -> float:
    """The most the stacks may take of the budget: a quarter of it, at most 5 s."""
    return max(0.0, min(STACKS_CAP_S, budget_s / 4))


def margin_s(budget_s: float) -> float:
    """What is kept back for SIGKILL, the last exits and the end record: 3 s, half of a short budget."""
    return min(3.0, budget_s / 2)


def grace_within(budget_s: float, grace_s: float, elapsed_s: float) -> float:
    """The SIGTERM -> SIGKILL grace that still ends the tree inside the engine's budget."""
    return max(0.0, min(grace_s, budget_s - elapsed_s - margin_s(budget_s)))


class EngineLink:
    """The engine's signals of one attached run, and its stop."""

    def __init__(self, options: JobOptions, record: RunRecorder, monotonic: Callable[[], float]) -> None:
        self.engine = options.engine or "engine"
        self.budget_s = options.engine_budget_s or DEFAULT_ENGINE_BUDGET_S
        self.record, self.monotonic = record, monotonic
        self.stop_signal: str | None = None
        self.stop_at: float | None = None  # monotonic: when the engine's stop reached the shim

    def on_signals(self, received: set[int], main: Member | None, now: float) -> bool:
        """Forward what goes to the job, record each; True when an engine stop begins."""
        for sig in sorted(received & _FORWARD):
            self._forward(RELAYED_USR1_AS.get(sig, sig), main, now)
        stops = sorted(received & _STOP)
        if not stops or self.stop_at is not None:
            return False
        self.stop_signal, self.stop_at = signal_name(stops[0]), self.monotonic()
        self.record.event(
            "engine-signal",
            now,
            signal=self.stop_signal,
            action="stop",
            engine=self.engine,
            budget_s=self.budget_s,
        )
        return True

    def _forward(self, sig: int, main: Member | None, now: float) -> None:
        name = signal_name(sig)
        delivered = False
        if main is not None:
            with contextlib.suppress(AccessDenied):
                delivered = pidfds.send_signal(main.pidfd, main.pid, sig)
        pid = main.pid if main is not None else None
        self.record.event(
            "engine-signal", now, signal=name, action="forwarded" if delivered else "not-delivered", pid=pid
        )

    def elapsed_s(self) -> float:
        return self.monotonic() - self.stop_at if self.stop_at is not None else 0.0

    def stacks_before_stop(
        self, store: Store, job_id: int, run: int, pids: Sequence[int], now: float
    ) -> None:
        """The job's stacks, stored before it is ended, whenever the budget leaves room: where it waited
        (a quiet job), or where it was when the time limit hit (a busy one printing steadily)."""
        cap = min(stacks_cap_s(self.budget_s), self.budget_s - self.elapsed_s() - margin_s(self.budget_s))
        if not pids or cap <= MIN_STACKS_S:
            return
        from jobwarden.probes.stacks import capture_stacks

        py_dir = store.layout.py_dir(job_id, run)
        began = self.monotonic()
        stacks = capture_stacks(pids, procfs=ProcFS(), py_dir=py_dir, timeout_s=cap)
        took = self.monotonic() - began
        log(f"engine stop: stacks of {len(stacks)} process(es) in {took:.2f}s (cap {cap:.2f}s)")
        if stacks:  # through the recorder: a locked store must not eat the engine's budget
            self.record.write(store.add_stacks, now, "engine-stop", stacks)

    def grace_s(self, asked_s: float) -> float:
        return grace_within(self.budget_s, asked_s, self.elapsed_s())

    def record_engine_state(self, env: Mapping[str, str], now: float) -> None:
        """Slurm's word on why (CANCELLED, TIMEOUT, PREEMPTED), asked with what is left of the budget."""
        if self.engine != "slurm":
            return
        from jobwarden.probes.slurm import job_state

        left = self.budget_s - self.elapsed_s() - 0.5
        found = job_state(env, min(2.0, left))
        if found is not None:
            self.record.event(
                "engine-state",
                now,
                engine="slurm",
                state=found.state,
                reason=found.reason,
                shown=found.shown,
                job=env.get("SLURM_JOB_ID"),
            )

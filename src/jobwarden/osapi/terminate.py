"""The one way jobwarden ends a set of processes: SIGTERM, a grace period during which newcomers are
ended too, then SIGKILL (the cgroup's kill first, where there is one) until nothing is left, and the
survivors. The shim ends its job's tree with it (shim/run/ending.py); `orphans --kill` ends strays with it
(control/killer.py).

What "the set" is differs: the shim holds the members of its job's tree and finds newcomers by
discovery; the killer holds targets it checked by identity and follows their process groups. Each says so
through `Ending`; the order of signals, waits and deadlines lives here only.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import NamedTuple, Protocol

from jobwarden.clock import Clock

POLL_S = 0.2  # how often newcomers are looked for during the grace


class KillPlan(NamedTuple):
    """After the grace: up to `rounds` rounds of SIGKILL, each waiting up to `round_wait_s` for the last
    one to end. SIGKILL takes effect at once unless a process is in D state."""

    rounds: int
    round_wait_s: float


class Ending(Protocol):
    """The processes being ended, as `terminate` drives them."""

    def alive(self) -> list[int]: ...  # held, not yet ended, and ours to signal

    def signal(self, pids: list[int], sig: int) -> None: ...  # a refusal is remembered, not raised

    def newcomers(self, full: bool) -> list[int]: ...  # taken since the last look (forks of the set)

    def wait(self, timeout_s: float) -> bool: ...  # until one ends or a signal; True: a stop request came

    def kill_all(self) -> None: ...  # the atomic kill of everything contained (cgroup.kill), if any


def terminate(
    ending: Ending,
    clock: Clock,
    grace_s: float,
    plan: KillPlan,
    requested_deadline: Callable[[], float] | None = None,
) -> list[int]:
    """End `ending`; returns the pids still alive. `requested_deadline`, asked whenever `wait` says a new
    request came, may bring the end of the grace closer (a second `stop --force`), never later."""
    # alive -> terminating: SIGTERM first, so a job can write its checkpoint
    ending.signal(ending.alive(), signal.SIGTERM)
    deadline = clock.monotonic() + grace_s
    while ending.alive() and clock.monotonic() < deadline:
        if ending.wait(min(POLL_S, deadline - clock.monotonic())) and requested_deadline is not None:
            deadline = min(deadline, requested_deadline())
        ending.signal(ending.newcomers(full=False), signal.SIGTERM)
    ending.signal(ending.newcomers(full=False), signal.SIGTERM)  # a last fork just before the grace ended
    # terminating -> killed: SIGKILL what is left, and what was forked meanwhile
    for _ in range(plan.rounds):
        if not ending.alive():
            break
        ending.kill_all()
        ending.signal(ending.alive(), signal.SIGKILL)
        round_end = clock.monotonic() + plan.round_wait_s
        while ending.alive() and clock.monotonic() < round_end:
            ending.wait(round_end - clock.monotonic())
        ending.signal(ending.newcomers(full=True), signal.SIGKILL)
    return ending.alive()

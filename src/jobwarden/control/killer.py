"""End a set of processes we did not start: SIGTERM, a grace period, SIGKILL, and a reason for each one
that could not be ended. The order of signals and waits is osapi.terminate's, shared with the shim.

Every signal goes through a pidfd opened *before* the identity check (pid + start time): once the check
passes, the pidfd names that very process, so a pid reused meanwhile is never signalled. Another user's
process is never touched unless we are root. A process group made only of targets is followed as a
whole: what the targets fork while they are being ended (same group) is ended too.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from jobwarden.clock import Clock, SystemClock
from jobwarden.control.orphans import Stray
from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.procfs import ProcFS, ProcStat, why_still_alive
from jobwarden.osapi.terminate import KillPlan, terminate
from jobwarden.osapi.users import user_name
from jobwarden.osapi.waiting import wait_readable

_KILL_WAIT_S = 3.0  # SIGKILL takes effect at once unless the process is in D state


@dataclass(frozen=True)
class Target:
    pid: int
    start_time: int
    uid: int | None
    pgid: int
    command: str


@dataclass(frozen=True)
class KillResult:
    """What became of one target. `how`: the signal that ended it, "gone" (it had exited, or its pid now
    names another process), or None when it is still alive; then `reason` says why."""

    pid: int
    command: str
    how: str | None
    reason: str | None = None
    uid: int | None = None

    @property
    def ended(self) -> bool:
        return self.how is not None

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "command": self.command,
            "ended": self.ended,
            "how": self.how,
            "reason": self.reason,
        }


class Handles(Protocol):
    """The OS seam: pidfds in real life, a recording fake in unit tests."""

    def open(self, pid: int) -> int: ...  # raises ProcessGone

    def send(self, handle: int, pid: int, sig: int) -> bool: ...  # False: exited; raises AccessDenied

    def wait(self, handles: Sequence[int], timeout_s: float) -> set[int]: ...  # those that exited

    def close(self, handle: int) -> None: ...


class PidfdHandles:
    def open(self, pid: int) -> int:
        return pidfds.open_pidfd(pid)

    def send(self, handle: int, pid: int, sig: int) -> bool:
        return pidfds.send_signal(handle, pid, sig)

    def wait(self, handles: Sequence[int], timeout_s: float) -> set[int]:
        return wait_readable(list(handles), timeout_s) if handles else set()

    def close(self, handle: int) -> None:
        pidfds.close(handle)


@dataclass
class _Held:
    target: Target
    handle: int
    last_signal: str | None = None


class Killer:
    def __init__(
        self,
        procfs: ProcFS,
        handles: Handles | None = None,
        clock: Clock | None = None,
        euid: int | None = None,
    ) -> None:
        self.procfs = procfs
        self.handles: Handles = handles or PidfdHandles()
        self.clock: Clock = clock or SystemClock()
        self.euid = os.geteuid() if euid is None else euid
        self._held: dict[int, _Held] = {}
        self._results: dict[int, KillResult] = {}
        self._groups: set[int] = set()

    def terminate(self, targets: Sequence[Target], grace_s: float) -> list[KillResult]:
        """SIGTERM every target, wait up to `grace_s`, SIGKILL the rest; one result per process."""
        self._held, self._results = {}, {}
        self._groups = self._groups_of_targets_only(targets)
        try:
            for target in targets:
                self._take(target)
            terminate(self, self.clock, grace_s, KillPlan(rounds=3, round_wait_s=_KILL_WAIT_S))
            for held in list(self._held.values()):
                self._settle(held, _result(held.target, None, self._why_alive(held)))
        finally:
            for held in self._held.values():
                self.handles.close(held.handle)
        order = {t.pid: i for i, t in enumerate(targets)}
        return sorted(self._results.values(), key=lambda r: order.get(r.pid, len(order)))

    # --- the Ending that osapi.terminate drives -----------------------------------------------------

    def alive(self) -> list[int]:
        return list(self._held)

    def signal(self, pids: list[int], sig: int) -> None:
        for pid in pids:
            held = self._held.get(pid)
            if held is not None:
                self._signal(held, sig)

    def newcomers(self, full: bool) -> list[int]:
        """What the followed groups forked since we looked (children of targets), taken."""
        return self._follow_groups(self._groups)

    def wait(self, timeout_s: float) -> bool:
        self._wait(timeout_s)
        return False  # no request reaches the killer while it works

    def kill_all(self) -> None:
        pass  # strays have no cgroup of ours: each is signalled by its pidfd

    # --- taking hold ------------------------------------------------------------------------------

    def _take(self, target: Target) -> None:
        if target.pid in self._held or target.pid in self._results:
            return
        if self.euid != 0 and target.uid is not None and target.uid != self.euid:
            reason = f"owned by another user ({user_name(target.uid)}): rerun with sudo to end it"
            self._results[target.pid] = _result(target, None, reason)
            return
        try:
            handle = self.handles.open(target.pid)
        except (ProcessGone, AccessDenied):
            self._results[target.pid] = _result(target, "gone")
            return
        # the pidfd is open: if the identity still matches now, the pidfd names the very process we judged
        if not self.procfs.identity_matches(target.pid, target.start_time):
            self.handles.close(handle)
            self._results[target.pid] = _result(target, "gone")
            return
        self._held[target.pid] = _Held(target, handle)

    def _groups_of_targets_only(self, targets: Sequence[Target]) -> set[int]:
        """Process groups whose every live member is a target: safe to follow as a whole."""
        pids = {t.pid for t in targets}
        members: dict[int, set[int]] = {}
        for st in self.procfs.iter_stats():
            if st.state not in ("Z", "X"):
                members.setdefault(st.pgid, set()).add(st.pid)
        return {t.pgid for t in targets if t.pgid > 1 and members.get(t.pgid, set()) <= pids}

    def _follow_groups(self, groups: set[int]) -> list[int]:
        """Take what the followed groups forked since we looked; the pids taken."""
        if not groups:
            return []
        taken = []
        for st in self.procfs.iter_stats():
            if st.pgid in groups and st.state not in ("Z", "X") and st.pid not in self._held:
                if st.pid in self._results:
                    continue
                self._take(self._target_of(st))
                if st.pid in self._held:
                    taken.append(st.pid)
        return taken

    def _target_of(self, st: ProcStat) -> Target:
        try:
            command = self.procfs.cmdline(st.pid)
            uid: int | None = self.procfs.uid(st.pid)
        except (ProcessGone, AccessDenied):
            command, uid = f"[{st.comm}]", None
        return Target(st.pid, st.start_time, uid, st.pgid, command)

    # --- signalling and waiting -------------------------------------------------------------------

    def _signal(self, held: _Held, sig: int) -> None:
        name = signal.Signals(sig).name
        try:
            delivered = self.handles.send(held.handle, held.target.pid, sig)
        except AccessDenied as err:
            self._settle(held, _result(held.target, None, f"{err.message}: {err.remedy}"))
            return
        if not delivered:  # it exited before the signal
            self._settle(held, _result(held.target, held.last_signal or "gone"))
            return
        held.last_signal = name

    def _wait(self, timeout_s: float) -> None:
        by_handle = {h.handle: h for h in self._held.values()}
        for handle in self.handles.wait(list(by_handle), max(0.0, timeout_s)):
            held = by_handle[handle]
            self._settle(held, _result(held.target, held.last_signal or "gone"))

    def _settle(self, held: _Held, result: KillResult) -> None:
        self._held.pop(held.target.pid, None)
        self.handles.close(held.handle)
        self._results[held.target.pid] = result

    def _why_alive(self, held: _Held) -> str:
        return why_still_alive(self.procfs, held.target.pid)


def end_strays(procfs: ProcFS, strays: Sequence[Stray], grace_s: float) -> list[KillResult]:
    """`jobwarden orphans --kill`: end every stray, each checked against the identity it was listed with."""
    targets = [Target(s.pid, s.start_time, s.uid, s.pgid, s.command) for s in strays]
    return Killer(procfs).terminate(targets, grace_s)


def _result(target: Target, how: str | None, reason: str | None = None) -> KillResult:
    return KillResult(target.pid, target.command, how, reason, target.uid)


def outcomes_json(
    listed: Sequence[dict[str, object]], results: Sequence[KillResult]
) -> list[dict[str, object]]:
    """`orphans --kill --json`: each stray as listed, with what became of it; processes a stray forked
    while being ended (followed through its process group) are added."""
    by_pid = {d["pid"]: d for d in listed}
    out = []
    for r in results:
        base = by_pid.get(r.pid) or {
            "pid": r.pid,
            "user": user_name(r.uid),
            "command": r.command,
            "reason": "started by a stray while it was being ended",
            "job": None,
        }
        out.append({**base, "ended": r.ended, "ended_by": r.how, "not_ended_because": r.reason})
    return out

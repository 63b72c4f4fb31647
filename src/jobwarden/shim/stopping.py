"""Ending a run: signal the whole tree (SIGTERM, the grace, SIGKILL), let multiprocessing's helpers end
by themselves, and record how the run ended and what was left."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from jobwarden.errors import AccessDenied, StoreError
from jobwarden.model import UNFINISHED_STATES, EndReason, JobState, Survivor
from jobwarden.osapi.cgroup import remove_dead_shims_cgroups
from jobwarden.osapi.procfs import why_still_alive
from jobwarden.osapi.terminate import KillPlan, terminate
from jobwarden.shim.loop import StopRequest, SupervisorLoop
from jobwarden.shim.recorder import end_fields, log
from jobwarden.shim.tree import Member

# Helpers that exit on their own when their last user does ("from multiprocessing.resource_tracker import
# main; main(5)"), and how long they get to do so before they count as orphans.
_SELF_ENDING = ("resource_tracker import main", "forkserver import main", "semaphore_tracker import main")
TRACKER_GRACE_S = 2.0


class StoppingSupervisor(SupervisorLoop):
    # --- ending -----------------------------------------------------------------------------------

    def _finish(self) -> int:
        orphans: list[dict[str, Any]] = []
        if self.stop:
            # running -> stopping: signal the whole tree, not only the leader
            self.record.write(self.store.update_run, only_if_state=UNFINISHED_STATES, state=JobState.STOPPING)
            self.record.event("stopping", self.clock.wall(), reason=str(self.stop.reason))
            survivors = self.terminate_tree(self._stop_grace(self.stop))
        else:
            self.tree.discover(full=True)
            self._let_trackers_finish()
            orphans = [{"pid": m.pid, "cmdline": m.cmdline} for m in self.tree.members.values()]
            survivors = self.terminate_tree(self.job.options.grace_s)
        self.logs.index(self.clock.wall())
        with contextlib.suppress(OSError):  # a kill in the last moments (the main process itself) counts too
            self._poll_oom(self.clock.wall())
        self.sampler.finish(self.clock.wall())
        if self.progress is not None:  # how far it got, kept with the run
            self._finish_progress()
        fields = end_fields(self.main_status, self.stop.reason if self.stop else None, self.clock.wall())
        self.record.end(fields, orphans, survivors)
        if self.engine and self.stop and self.stop.reason == EndReason.ENGINE_STOP:
            self.engine.record_engine_state(os.environ, self.clock.wall())
        self.record.write(self.store.release_gpus)
        self._remove_cgroup()
        self.tree.close()
        self.exits.close()
        if self.memory:
            self.memory.close()
        if self.diag and self.diag.gpu:
            self.diag.gpu.close()
        return 0

    def _finish_progress(self) -> None:
        """The last look at the run's progress: nothing in it may cost the run its end record."""
        try:
            self.progress.finish(self.clock.wall(), self.clock.monotonic())  # type: ignore[union-attr]
        except Exception as err:
            log(f"progress at the end not recorded: {type(err).__name__}: {err}")

    def _stop_grace(self, stop: StopRequest) -> float:
        """The grace of a stop; an engine's stop first stores a quiet job's stacks, and its grace fits
        what is left of the engine's budget."""
        if stop.reason != EndReason.ENGINE_STOP or self.engine is None:
            return stop.grace_s
        quiet = self.diag.tracker.quiet_for(self.clock.monotonic()) if self.diag else None
        pids = sorted(self.tree.members)
        self.engine.stacks_before_stop(self.store, self.job.id, self.run, pids, quiet, self.clock.wall())
        return self.engine.grace_s(stop.grace_s)

    def _let_trackers_finish(self) -> None:
        """multiprocessing's resource tracker and forkserver (loky's too) end by themselves once the last
        process holding their pipe has ended: a few milliseconds after the main process, not orphans."""
        deadline = self.clock.monotonic() + TRACKER_GRACE_S
        while any(_ends_by_itself(m.cmdline) for m in self.tree.members.values()):
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return
            self._wait_members(min(0.1, left))

    def terminate_tree(self, grace_s: float) -> list[Survivor]:
        """SIGTERM every member, wait up to the grace (terminating newcomers too), then SIGKILL the rest
        (osapi.terminate); a second `stop` may cut the grace short."""
        self.tree.discover(full=True)
        plan = KillPlan(rounds=10, round_wait_s=0.5)
        terminate(_TreeEnding(self), self.clock, grace_s, plan, self._requested_deadline)
        return [Survivor(m.pid, m.cmdline, self._why_alive(m.pid)) for m in self.tree.members.values()]

    def _requested_deadline(self) -> float:
        """When the latest `stop` wants the tree gone: a second `stop --force` (or a shorter --grace)
        cuts a long grace short; a longer one never extends it (the caller keeps the earlier)."""
        try:
            record = self.store.run(self.job.id, self.run)
        except StoreError as err:
            log(f"cannot read the stop request: {err}")
            return float("inf")
        if record.stop_requested_at is None or record.stop_grace is None:
            return float("inf")
        left = record.stop_requested_at + record.stop_grace - self.clock.wall()
        return self.clock.monotonic() + max(0.0, left)

    def _signal_all(self, sig: int, only: list[Member] | None = None) -> None:
        for member in list(self.tree.members.values()) if only is None else only:
            try:
                self.jobos.send_signal(member, sig)
            except AccessDenied as err:
                self.denied[member.pid] = f"{err.message}: {err.remedy}"

    def _why_alive(self, pid: int) -> str:
        if pid in self.denied:
            return self.denied[pid]
        return why_still_alive(self.procfs, pid)

    def _remove_cgroup(self) -> None:
        if self.cgroup:
            self.cgroup.remove()
            remove_dead_shims_cgroups()  # and those of shims killed before their end, if any


def _ends_by_itself(cmdline: str) -> bool:
    return any(helper in cmdline for helper in _SELF_ENDING)


class _TreeEnding:
    """The job's tree as osapi.terminate drives it: its members, newcomers found by discovery, the
    cgroup's kill, and a SIGUSR1 (a new `stop`) while waiting."""

    def __init__(self, sup: StoppingSupervisor) -> None:
        self.sup = sup

    def alive(self) -> list[int]:
        return [pid for pid in self.sup.tree.members if pid not in self.sup.denied]

    def signal(self, pids: list[int], sig: int) -> None:
        members = self.sup.tree.members
        self.sup._signal_all(sig, only=[members[pid] for pid in pids if pid in members])

    def newcomers(self, full: bool) -> list[int]:
        return [member.pid for member in self.sup.tree.discover(full=full)]

    def wait(self, timeout_s: float) -> bool:
        return signal.SIGUSR1 in self.sup._wait_members(timeout_s)

    def kill_all(self) -> None:
        if self.sup.cgroup:
            with contextlib.suppress(OSError):
                self.sup.jobos.kill_cgroup(self.sup.cgroup)

"""Ending a run: signal the whole tree (SIGTERM, the grace, SIGKILL), let multiprocessing's helpers end
by themselves, and record how the run ended and what was left."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from jobwarden.errors import AccessDenied, ProcessGone, StoreError
from jobwarden.model import UNFINISHED_STATES, EndReason, JobState, Survivor
from jobwarden.osapi.cgroup import remove_dead_shims_cgroups
from jobwarden.osapi.procfs import why_still_alive
from jobwarden.osapi.terminate import KillPlan, terminate
from jobwarden.shim.record.recorder import end_fields, log
from jobwarden.shim.run.loop import StopRequest, SupervisorLoop
from jobwarden.shim.tree.jobtree import Member

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
            # `jobwarden stop` and an engine's stop end everything; a timeout or a hang keeps them
            kept = (
                [] if self.stop.reason in (EndReason.STOPPED, EndReason.ENGINE_STOP) else self._keep_running()
            )
            survivors = self.terminate_tree(self._stop_grace(self.stop))
        else:
            if self.diag:  # the main process ended by itself: a hang that it printed its way out of is over
                self._act_on(self.diag.on_end(self.clock.wall(), self.clock.monotonic()))
            self.tree.discover(full=True)
            self._let_trackers_finish()
            kept = self._keep_running()  # released first: kept processes are neither orphans nor ended
            orphans = [{"pid": m.pid, "cmdline": m.cmdline} for m in self.tree.members.values()]
            survivors = self.terminate_tree(self.job.options.grace_s)
        self.logs.index(self.clock.wall(), cap=False)  # the end is recorded first, the log capped after
        with contextlib.suppress(OSError):  # a kill in the last moments (the main process itself) counts too
            self._poll_oom(self.clock.wall())
        self.sampler.finish(self.clock.wall())
        if self.progress is not None:  # how far it got, kept with the run
            self._finish_progress()
        self.prune_py_files()  # every process has ended: only exceptions and fork records stay
        self.record_fingerprint(final=True)  # before the end: an ended run has its fingerprint
        fields = end_fields(self.main_status, self.stop.reason if self.stop else None, self.clock.wall())
        if kept:
            fields["kept"] = kept
        self.record.end(fields, orphans, survivors)
        self.logs.cap_now()  # freeing a gigabyte takes a moment: not before the end it would delay
        self.note_trims(self.clock.wall(), final=True)
        if self.engine and self.stop and self.stop.reason == EndReason.ENGINE_STOP:
            self.engine.record_engine_state(os.environ, self.clock.wall())  # inside the engine's budget
        self.record.write(self.store.release_gpus)
        self._remove_cgroup()
        self._store_verdict()  # last: the end, Slurm's word and the GPUs first
        self.tree.close()
        self.exits.close()
        if self.memory:
            self.memory.close()
        if self.diag and self.diag.gpu:
            self.diag.gpu.close()
        return 0

    def _keep_running(self) -> list[dict[str, Any]]:
        """--keep-running: the members whose command line matches (as read now: a shell may have exec'd
        the program since it was first seen), and their descendants, are released, out of the job's
        cgroup where it can be left: not orphans, never signalled; recorded as kept."""
        patterns = self.job.options.keep_running
        if not patterns:
            return []
        self.tree.discover(full=True)
        for member in self.tree.members.values():
            with contextlib.suppress(ProcessGone, AccessDenied):
                member.cmdline = self.procfs.cmdline(member.pid)
        from jobwarden.shim.run.keeping import choose

        # each search bounded: a pattern that backtracks for ever must not keep the end from being recorded
        matched = choose(patterns, {pid: m.cmdline for pid, m in self.tree.members.items()})
        for pattern in matched.too_slow:
            log(f"--keep-running {pattern!r}: a search ran out of time (it backtracks): kept nothing")
            self.record.event("keep-running-too-slow", self.clock.wall(), pattern=pattern)
        chosen = {pid: m for pid, m in self.tree.members.items() if pid in matched.pids}
        grown = True
        while grown:  # and what they started
            more = {m.pid: m for m in self.tree.members.values() if m.ppid in chosen and m.pid not in chosen}
            chosen.update(more)
            grown = bool(more)
        kept = []
        for member in chosen.values():
            moved = bool(self.cgroup and self.cgroup.move_out(member.pid))
            self.tree.release(member)
            kept.append({"pid": member.pid, "start_time": member.ident.start_time, "cmdline": member.cmdline})
            log(
                f"--keep-running: left pid {member.pid} running ({member.cmdline[:80]})"
                + (", moved out of the job's cgroup" if moved else "")
            )
        if kept:
            self.record.event("kept-running", self.clock.wall(), pids=[k["pid"] for k in kept])
        return kept

    def _store_verdict(self) -> None:
        """The run's root cause, kept with it for every list; never at the cost of the run's end."""
        if self.spawn_failed:
            return
        try:
            record = self.store.run(self.job.id, self.run)
            if record.state == JobState.SUCCEEDED and not any(
                f.current for _, f in self.store.findings(self.job.id, self.run)
            ):
                return  # nothing to judge: no rules loaded (a short attached step waits for none)
            from jobwarden.verdict.explainer import store_verdict

            store_verdict(self.store, self.job, self.run, self.clock.wall)
        except Exception as err:  # a full disk, a locked store: the lists judge it themselves then
            log(f"cannot store the verdict: {type(err).__name__}: {err}")

    def _finish_progress(self) -> None:
        """The last look at the run's progress: nothing in it may cost the run its end record."""
        try:
            self.progress.finish(self.clock.wall(), self.clock.monotonic())  # type: ignore[union-attr]
        except Exception as err:
            log(f"progress at the end not recorded: {type(err).__name__}: {err}")

    def _stop_grace(self, stop: StopRequest) -> float:
        """The grace of a stop; an engine's stop first stores the job's stacks, and its grace fits what is
        left of the engine's budget."""
        if stop.reason != EndReason.ENGINE_STOP or self.engine is None:
            return stop.grace_s
        pids = sorted(self.tree.members)
        self.engine.stacks_before_stop(self.store, self.job.id, self.run, pids, self.clock.wall())
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
        cgroup = self.sup.cgroup
        if cgroup and not set(self.sup.tree.kept) & set(cgroup.pids()):  # never a process kept in it
            with contextlib.suppress(OSError):
                self.sup.jobos.kill_cgroup(cgroup)

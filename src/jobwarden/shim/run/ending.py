"""Ending a run, one part of the supervisor: signal the whole tree (SIGTERM, the grace, SIGKILL), let
multiprocessing's helpers end by themselves, and record how the run ended and what was left; a run that
never started is ended here too."""

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
from jobwarden.shim.run.state import RunState, StopRequest
from jobwarden.shim.run.watching import Watching
from jobwarden.shim.tree.jobtree import Member

# Helpers that exit on their own when their last user does ("from multiprocessing.resource_tracker import
# main; main(5)"), and how long they get to do so before they count as orphans.
_SELF_ENDING = ("resource_tracker import main", "forkserver import main", "semaphore_tracker import main")
TRACKER_GRACE_S = 2.0


class Ending:
    def __init__(self, state: RunState, watching: Watching) -> None:
        self.state, self.watching = state, watching

    def finish(self) -> int:
        orphans: list[dict[str, Any]] = []
        if self.state.stop:
            # running -> stopping: signal the whole tree, not only the leader
            self.state.record.write(
                self.state.store.update_run, only_if_state=UNFINISHED_STATES, state=JobState.STOPPING
            )
            self.state.record.event("stopping", self.state.clock.wall(), reason=str(self.state.stop.reason))
            # `jobwarden stop` and an engine's stop end everything; a timeout or a hang keeps them
            kept = (
                []
                if self.state.stop.reason in (EndReason.STOPPED, EndReason.ENGINE_STOP)
                else self._keep_running()
            )
            survivors = self.terminate_tree(self._stop_grace(self.state.stop))
        else:
            # the main process ended by itself: a hang that it printed its way out of is over
            if self.state.diag:
                self.watching.act_on(
                    self.state.diag.on_end(self.state.clock.wall(), self.state.clock.monotonic())
                )
            self.state.tree.discover(full=True)
            self._let_trackers_finish()
            kept = self._keep_running()  # released first: kept processes are neither orphans nor ended
            orphans = [{"pid": m.pid, "cmdline": m.cmdline} for m in self.state.tree.members.values()]
            survivors = self.terminate_tree(self.state.job.options.grace_s)
        # the end is recorded first, the log capped after
        self.state.logs.index(self.state.clock.wall(), cap=False)
        with contextlib.suppress(OSError):  # a kill in the last moments (the main process itself) counts too
            self.watching.poll_oom(self.state.clock.wall())
        self.state.sampler.finish(self.state.clock.wall())
        if self.state.progress is not None:  # how far it got, kept with the run
            self._finish_progress()
        self.watching.prune_py_files()  # every process has ended: only exceptions and fork records stay
        self.watching.record_fingerprint(final=True)  # before the end: an ended run has its fingerprint
        fields = end_fields(
            self.state.main_status,
            self.state.stop.reason if self.state.stop else None,
            self.state.clock.wall(),
        )
        if kept:
            fields["kept"] = kept
        self.state.record.end(fields, orphans, survivors)
        self.state.logs.cap_now()  # freeing a gigabyte takes a moment: not before the end it would delay
        self.watching.note_trims(self.state.clock.wall(), final=True)
        if self.state.engine and self.state.stop and self.state.stop.reason == EndReason.ENGINE_STOP:
            # inside the engine's budget
            self.state.engine.record_engine_state(os.environ, self.state.clock.wall())
        self.state.record.write(self.state.store.release_gpus)
        self.remove_cgroup()
        self._store_verdict()  # last: the end, Slurm's word and the GPUs first
        self.state.tree.close()
        self.state.exits.close()
        if self.state.memory:
            self.state.memory.close()
        if self.state.diag and self.state.diag.gpu:
            self.state.diag.gpu.close()
        return 0

    def _keep_running(self) -> list[dict[str, Any]]:
        """--keep-running: the members whose command line matches (as read now: a shell may have exec'd
        the program since it was first seen), and their descendants, are released, out of the job's
        cgroup where it can be left: not orphans, never signalled; recorded as kept."""
        patterns = self.state.job.options.keep_running
        if not patterns:
            return []
        self.state.tree.discover(full=True)
        for member in self.state.tree.members.values():
            with contextlib.suppress(ProcessGone, AccessDenied):
                member.cmdline = self.state.procfs.cmdline(member.pid)
        from jobwarden.shim.run.keeping import choose

        # each search bounded: a pattern that backtracks for ever must not keep the end from being recorded
        matched = choose(patterns, {pid: m.cmdline for pid, m in self.state.tree.members.items()})
        for pattern in matched.too_slow:
            log(f"--keep-running {pattern!r}: a search ran out of time (it backtracks): kept nothing")
            self.state.record.event("keep-running-too-slow", self.state.clock.wall(), pattern=pattern)
        chosen = {pid: m for pid, m in self.state.tree.members.items() if pid in matched.pids}
        grown = True
        while grown:  # and what they started
            more = {
                m.pid: m for m in self.state.tree.members.values() if m.ppid in chosen and m.pid not in chosen
            }
            chosen.update(more)
            grown = bool(more)
        kept = []
        for member in chosen.values():
            moved = bool(self.state.cgroup and self.state.cgroup.move_out(member.pid))
            self.state.tree.release(member)
            kept.append({"pid": member.pid, "start_time": member.ident.start_time, "cmdline": member.cmdline})
            log(
                f"--keep-running: left pid {member.pid} running ({member.cmdline[:80]})"
                + (", moved out of the job's cgroup" if moved else "")
            )
        if kept:
            self.state.record.event("kept-running", self.state.clock.wall(), pids=[k["pid"] for k in kept])
        return kept

    def _store_verdict(self) -> None:
        """The run's root cause, kept with it for every list; never at the cost of the run's end."""
        if self.state.spawn_failed:
            return
        try:
            record = self.state.store.run(self.state.job.id, self.state.run)
            if record.state == JobState.SUCCEEDED and not any(
                f.current for _, f in self.state.store.findings(self.state.job.id, self.state.run)
            ):
                return  # nothing to judge: no rules loaded (a short attached step waits for none)
            from jobwarden.verdict.explainer import store_verdict

            store_verdict(self.state.store, self.state.job, self.state.run, self.state.clock.wall)
        except Exception as err:  # a full disk, a locked store: the lists judge it themselves then
            log(f"cannot store the verdict: {type(err).__name__}: {err}")

    def _finish_progress(self) -> None:
        """The last look at the run's progress: nothing in it may cost the run its end record."""
        try:
            self.state.progress.finish(self.state.clock.wall(), self.state.clock.monotonic())  # type: ignore[union-attr]
        except Exception as err:
            log(f"progress at the end not recorded: {type(err).__name__}: {err}")

    def _stop_grace(self, stop: StopRequest) -> float:
        """The grace of a stop; an engine's stop first stores the job's stacks, and its grace fits what is
        left of the engine's budget."""
        if stop.reason != EndReason.ENGINE_STOP or self.state.engine is None:
            return stop.grace_s
        pids = sorted(self.state.tree.members)
        self.state.engine.stacks_before_stop(
            self.state.store, self.state.job.id, self.state.run, pids, self.state.clock.wall()
        )
        return self.state.engine.grace_s(stop.grace_s)

    def _let_trackers_finish(self) -> None:
        """multiprocessing's resource tracker and forkserver (loky's too) end by themselves once the last
        process holding their pipe has ended: a few milliseconds after the main process, not orphans."""
        deadline = self.state.clock.monotonic() + TRACKER_GRACE_S
        while any(_ends_by_itself(m.cmdline) for m in self.state.tree.members.values()):
            left = deadline - self.state.clock.monotonic()
            if left <= 0:
                return
            self.watching.wait_members(min(0.1, left))

    def terminate_tree(self, grace_s: float) -> list[Survivor]:
        """SIGTERM every member, wait up to the grace (terminating newcomers too), then SIGKILL the rest
        (osapi.terminate); a second `stop` may cut the grace short."""
        self.state.tree.discover(full=True)
        plan = KillPlan(rounds=10, round_wait_s=0.5)
        terminate(_TreeEnding(self), self.state.clock, grace_s, plan, self._requested_deadline)
        return [Survivor(m.pid, m.cmdline, self._why_alive(m.pid)) for m in self.state.tree.members.values()]

    def _requested_deadline(self) -> float:
        """When the latest `stop` wants the tree gone: a second `stop --force` (or a shorter --grace)
        cuts a long grace short; a longer one never extends it (the caller keeps the earlier)."""
        try:
            record = self.state.store.run(self.state.job.id, self.state.run)
        except StoreError as err:
            log(f"cannot read the stop request: {err}")
            return float("inf")
        if record.stop_requested_at is None or record.stop_grace is None:
            return float("inf")
        left = record.stop_requested_at + record.stop_grace - self.state.clock.wall()
        return self.state.clock.monotonic() + max(0.0, left)

    def signal_all(self, sig: int, only: list[Member] | None = None) -> None:
        for member in list(self.state.tree.members.values()) if only is None else only:
            try:
                self.state.jobos.send_signal(member, sig)
            except AccessDenied as err:
                self.state.denied[member.pid] = f"{err.message}: {err.remedy}"

    def _why_alive(self, pid: int) -> str:
        if pid in self.state.denied:
            return self.state.denied[pid]
        return why_still_alive(self.state.procfs, pid)

    def remove_cgroup(self) -> None:
        if self.state.cgroup:
            self.state.cgroup.remove()
            remove_dead_shims_cgroups()  # and those of shims killed before their end, if any

    def end_unstarted(self) -> int:
        """A queued run that never started: stopped by the user, cancelled (--after), or impossible here
        (not enough GPUs)."""
        now = self.state.clock.wall()
        stop = self.state.stop.reason if self.state.stop else None
        stopped = stop in (EndReason.STOPPED, EndReason.ENGINE_STOP)
        reason = stop if stop and (stopped or stop == EndReason.DEPENDENCY_FAILED) else EndReason.SPAWN_FAILED
        # queued -> stopped | failed
        self.state.store.update_run(
            self.state.job.id,
            self.state.run,
            state=JobState.STOPPED if stopped else JobState.FAILED,
            end_reason=reason,
            ended_at=now,
            queued_reason=None,
        )
        self.state.store.add_event(
            self.state.job.id, self.state.run, "ended", now, state="stopped" if stopped else "failed"
        )
        self.state.store.release_gpus(self.state.job.id, self.state.run)
        self.remove_cgroup()
        return 0


def _ends_by_itself(cmdline: str) -> bool:
    return any(helper in cmdline for helper in _SELF_ENDING)


class _TreeEnding:
    """The job's tree as osapi.terminate drives it: its members, newcomers found by discovery, the
    cgroup's kill, and a SIGUSR1 (a new `stop`) while waiting."""

    def __init__(self, ending: Ending) -> None:
        self.ending = ending
        self.state = ending.state

    def alive(self) -> list[int]:
        return [pid for pid in self.state.tree.members if pid not in self.state.denied]

    def signal(self, pids: list[int], sig: int) -> None:
        members = self.state.tree.members
        self.ending.signal_all(sig, only=[members[pid] for pid in pids if pid in members])

    def newcomers(self, full: bool) -> list[int]:
        return [member.pid for member in self.state.tree.discover(full=full)]

    def wait(self, timeout_s: float) -> bool:
        return signal.SIGUSR1 in self.ending.watching.wait_members(timeout_s)

    def kill_all(self) -> None:
        cgroup = self.state.cgroup
        if cgroup and not set(self.state.tree.kept) & set(cgroup.pids()):  # never a process kept in it
            with contextlib.suppress(OSError):
                self.state.jobos.kill_cgroup(cgroup)

"""The shim's judgement while a run is live: it notices deaths, stopped processes, OOM kills and hangs,
gathers their evidence (process states, stacks, fork records, counters), asks the pure rules, and records
each finding once, with the stacks it rests on.

Events do not wait for the hang window: a pool worker killed while its parent waits is judged as soon as
its death is collected, a stopped process at the next tick. Only `no-progress` and the hang families that
need a quiet window wait for it.

A finding that stops being true is resolved, with the moment (shim.record.findings): a stopped process that
was continued, a hang once the run shows progress again, an idle GPU that computes again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobwarden.errors import AccessDenied, ProcessGone, StoreError
from jobwarden.model import Finding, ProcessEnd, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pyhooks import read_heartbeat
from jobwarden.shim.record.findings import LiveFindings
from jobwarden.shim.tree.jobtree import JobTree, Member
from jobwarden.shim.watch.watchdog import Progress, ProgressTracker
from jobwarden.store import JobRecord, Store

if TYPE_CHECKING:  # the rules, the stack capture and the GPU watch load at the first judgement, or with a
    # GPU: an idle job never judged never pays for them (the shim's memory, issue 25)
    from jobwarden.observations import (
        FeedSite,
        LockSite,
        OomEvidence,
        ProcessDeath,
        ProcessFacts,
        ProcessStack,
        Wait,
        WaitParty,
    )
    from jobwarden.shim.watch.gpuwatch import GpuWatch
    from jobwarden.shim.watch.progresswatch import StepSign

STACK_TIMEOUT_S = 5.0
OWNERS_TIMEOUT_S = 2.0  # the second dump of a hung process whose instance locks need their objects
# a rank symbolises its recorder's stacks in ~1.2 CPU-s the first time it is asked (1.9 s measured on a
# loaded machine), possibly after the judgement stopped waiting for it
RECORDER_EFFORT_S = 5.0
LOG_TAIL_LINES = 40
IO_EVERY_S = 5.0  # /proc/PID/io of every member is read only while the cheaper signs show nothing


@dataclass(frozen=True)
class Verdict:
    """What one judgement found that was not known before."""

    trigger: str  # "hang", "worker-lost", "stopped", "oom", "gpu-idle", "resolved"
    findings: tuple[Finding, ...]
    resolved: tuple[Finding, ...] = ()  # findings that stopped being true, with the moment

    @property
    def hung(self) -> bool:
        return self.trigger == "hang"

    @property
    def recovered(self) -> bool:
        """A hang ended: the run shows progress again."""
        return bool(self.resolved) and any(f.rule in _hang_rules() for f in self.resolved)


def _hang_rules() -> frozenset[str]:
    from jobwarden.rules.table import ENDS_WITH_THE_HANG

    return ENDS_WITH_THE_HANG


class Diagnoser:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        run: int,
        procfs: ProcFS,
        tree: JobTree,
        window_s: float | None,
        now_mono: float,
    ) -> None:
        self.store, self.job, self.run, self.procfs, self.tree = store, job, run, procfs, tree
        self.layout = store.layout
        # a Store method's write for this run (shim.record.recorder's, set by the loop: never held up by a
        # lock)
        self.write: Callable[..., bool] = self._write_now
        self.py_dir = self.layout.py_dir(job.id, run)
        self.tracker = ProgressTracker(window_s, now_mono)
        self.deaths: list[ProcessDeath] = []
        self.oom: OomEvidence | None = None
        self.main_pid: int | None = None
        self.gpu: GpuWatch | None = None
        self._gpu_idle_reported = False
        self.live = LiveFindings(store, lambda *args: self.write(*args))  # whatever writer is set later
        self._hung = False  # a hang was reported and no progress came since
        self._stopped_seen: set[tuple[int, int]] = set()
        self._oom_judged = 0  # OOM kills counted when the rules last looked
        self._io_at = -IO_EVERY_S
        self._recorder_answers: dict[int, int] = {}  # rank pid -> mtime_ns of its last recorder answer
        self._boot = procfs.boot_time()
        self.steps: StepSign | None = None  # the run's step counter, when it shows one

    # --- events -----------------------------------------------------------------------------------

    def on_exits(
        self, ended: Sequence[ProcessEnd], now: float, now_mono: float, main: Member | None
    ) -> Verdict | None:
        """Processes that ended, with their wait status. An abnormal death of a descendant is judged at
        once, with the stacks of its parent (a Pool parent waiting for a result it will never get)."""
        from jobwarden.rules.evidence import death_of

        suspicious: list[ProcessDeath] = []
        for end in ended:
            death = death_of(end, is_main=end.pid == self.main_pid)
            self.deaths.append(death)
            if not death.is_main and death.abnormal:
                suspicious.append(death)
        if not suspicious:
            return None
        parents = {d.ppid for d in suspicious if d.ppid in self.tree.members}
        return self.judge("worker-lost", now, now_mono, stack_pids=sorted(parents | _main(main)))

    def on_tick(self, snaps: Sequence[ProcessSnapshot], now: float, now_mono: float) -> Verdict | None:
        """Progress, stopped processes and OOM kills (the shim sets `oom` as it reads the counters), every
        tick; a hang when the window passes."""
        verdict = None
        stopped = {(s.pid, s.start_time) for s in snaps if s.state == "T"}  # 't' is a tracer (py-spy)
        resolved = self._resolve_stopped({pid for pid, _ in stopped}, now)
        self._stopped_seen &= stopped  # continued, then stopped again: judged again
        if stopped - self._stopped_seen:
            self._stopped_seen |= stopped
            verdict = self.judge("stopped", now, now_mono, snaps=snaps)
        if self.oom is not None and self.oom.kills > self._oom_judged:  # kills no judgement has seen yet
            verdict = self.judge("oom", now, now_mono, snaps=snaps) or verdict
        if self.tracker.observe(now_mono, self._progress(snaps, now_mono)) and self._hung:
            self._hung = False  # hung -> progressing again: the hang's findings are history now
            resolved += self.live.resolve_rules(_hang_rules(), now)
        idle_for = self.gpu.idle_for(now_mono) if self.gpu else None
        window = self.tracker.window_s
        if idle_for is None:
            if self._gpu_idle_reported:
                resolved += self.live.resolve_rules(("gpu-idle",), now)
            self._gpu_idle_reported = False
        elif window and idle_for >= window and not self._gpu_idle_reported:
            self._gpu_idle_reported = True
            verdict = self.judge("gpu-idle", now, now_mono, snaps=snaps) or verdict
        if self.tracker.hang_due(now_mono):
            self.tracker.mark_reported()
            self._hung = True
            hang = self.judge(
                "hang", now, now_mono, snaps=snaps, stack_pids=sorted(self.tree.members), hung=True
            )
            verdict = hang or Verdict("hang", ())
        if resolved:
            verdict = dataclasses.replace(verdict or Verdict("resolved", ()), resolved=tuple(resolved))
        return verdict

    def on_end(self, now: float, now_mono: float) -> Verdict | None:
        """The run's last look: a hung job that printed (or beat) and then ended at once recovered before
        it ended, though no tick came between its output and its end."""
        if not self._hung:
            return None
        output = None
        with contextlib.suppress(OSError):
            output = os.stat(self.layout.output_log(self.job.id, self.run)).st_size
        beat = read_heartbeat(self.layout.heartbeat_file(self.job.id, self.run))
        if not self.tracker.observe(
            now_mono, Progress(output_bytes=output, heartbeat_at=beat.at if beat else None)
        ):
            return None
        self._hung = False
        resolved = self.live.resolve_rules(_hang_rules(), now)
        return Verdict("resolved", (), tuple(resolved)) if resolved else None

    def _resolve_stopped(self, stopped_now: set[int], now: float) -> list[Finding]:
        """A stopped process that runs again (SIGCONT) or is gone: its process-stopped finding is history."""
        return self.live.resolve_where(
            lambda f: f.rule == "process-stopped" and not stopped_now.intersection(f.pids), now
        )

    def _progress(self, snaps: Sequence[ProcessSnapshot], now_mono: float) -> Progress:
        if self.tracker.quiet_for(now_mono) >= 1.0 and self._recorder_answered():
            # a rank answered a flight-recorder request (`jobwarden dump`'s, or a judgement's): its CPU
            # and the file it wrote are jobwarden's doing, not the job's
            self.tracker.discount(now_mono + RECORDER_EFFORT_S)
        output = None
        with contextlib.suppress(OSError):
            output = os.stat(self.layout.output_log(self.job.id, self.run)).st_size
        beat = read_heartbeat(self.layout.heartbeat_file(self.job.id, self.run))
        cpu = sum(s.cpu_percent or 0.0 for s in snaps)
        usage = self.gpu.sample(now_mono, [s.pid for s in snaps]) if self.gpu else None
        gpu_util = usage.max_utilization if usage and usage.total_bytes else None
        step_active, step_moved = self.steps.read() if self.steps else (False, False)
        seen = Progress(
            output_bytes=output,
            heartbeat_at=beat.at if beat else None,
            cpu_percent=cpu,
            gpu_util_percent=gpu_util,
            step_active=step_active,
            step_moved=step_moved,
        )
        # at least three readings per window, so quiet but steady I/O is seen before the window ends
        every = min(IO_EVERY_S, (self.tracker.window_s or IO_EVERY_S) / 3)
        if self.tracker.quiet_for(now_mono) >= 1.0 and now_mono - self._io_at >= every:
            self._io_at = now_mono
            seen = seen._replace(io_bytes=self._io_bytes())
        return seen

    def _recorder_answered(self) -> bool:
        """Some member's `<pid>.fr.json` changed since the last look (one stat per member, only while the
        run is quiet). The rank watch's polls need no discount: their answers cost a rank 1.8 ms of CPU
        every 10 s, far below the CPU that counts, and no I/O (the hooks' _write_mapped); discounting
        them every 10 s would leave a job whose only progress is I/O looking hung."""
        from jobwarden.probes.flightrec import DUMP

        answered = False
        for pid in list(self.tree.members):
            try:
                mtime = os.stat(self.py_dir / f"{pid}{DUMP}", follow_symlinks=False).st_mtime_ns
            except OSError:
                continue
            answered |= self._recorder_answers.get(pid) != mtime
            self._recorder_answers[pid] = mtime
        return answered

    def _io_bytes(self) -> int:
        total = 0
        for pid in list(self.tree.members):
            with contextlib.suppress(ProcessGone, AccessDenied):
                total += self.procfs.io_chars(pid) or 0
        return total

    # --- judging ----------------------------------------------------------------------------------

    def judge(
        self,
        trigger: str,
        now: float,
        now_mono: float,
        *,
        snaps: Sequence[ProcessSnapshot] = (),
        stack_pids: Sequence[int] = (),
        hung: bool = False,
    ) -> Verdict | None:
        """Gather the evidence, ask the rules, record what is new (with the stacks it rests on)."""
        from jobwarden.probes import flightrec
        from jobwarden.probes.pyhooks import read_fork_requests, read_forks
        from jobwarden.probes.stacks import capture_stacks
        from jobwarden.rules import RunEvidence, explain
        from jobwarden.rules.table import LIVE  # what the shim may conclude while the run is live

        snaps = snaps or self.tree.sample(now)
        # the ranks' flight recorders are asked first: they answer while the stacks are captured, and
        # the wait for what is still missing comes after (at most flightrec.WAIT_S)
        asked = flightrec.request(self.py_dir, sorted(self.tree.members)) if hung else []
        # the waits before the stacks: a dump that attaches interrupts a sleep, which then reads as
        # restart_syscall
        waits, parties = self._waits() if hung else ([], {})
        stacks = capture_stacks(stack_pids, procfs=self.procfs, py_dir=self.py_dir, timeout_s=STACK_TIMEOUT_S)
        recorders = flightrec.collect(asked) if asked else []
        sites = self._lock_sites(stacks) if hung else {}
        if hung:
            stacks, sites = self._with_owners(stacks, sites)
        fed = self._feed_sites(stacks) if hung else {}
        if asked:  # the ranks' answers cost them CPU and a file write: not a sign the job moves again
            self.tracker.discount(now_mono + STACK_TIMEOUT_S + flightrec.WAIT_S + RECORDER_EFFORT_S)
        evidence = RunEvidence(
            state="running",
            exit_code=None,
            signal=None,
            end_reason=None,
            pid=self.main_pid,
            job_id=self.job.id,
            mp_start=self.job.options.mp_start,
            now=now,
            hang_window_s=self.tracker.window_s if hung else None,
            quiet_for_s=self.tracker.quiet_for(now_mono),
            last_progress=self.tracker.last_kind,
            step_note=self.steps.note(now_mono) if self.steps and hung else None,
            log_tail=self._log_tail(),
            processes=self.facts(snaps),
            deaths=tuple(self.deaths),
            stacks=tuple(stacks),
            waits=tuple(waits),
            wait_parties=parties,
            lock_sites=sites,
            feed_sites=fed,
            recorders=tuple(recorders),
            forks=tuple(read_forks(self.py_dir)),
            fork_requests=tuple(read_fork_requests(self.py_dir)),
            oom=self.oom,
            mem_limit_bytes=self.job.options.mem_limit_bytes,
            gpus=tuple(self.gpu.devices) if self.gpu else (),
            gpu_processes=tuple(self.gpu.processes) if self.gpu else (),
            gpu_idle_for_s=self.gpu.idle_for(now_mono) if self.gpu else None,
            gpu_idle_window_s=self.tracker.window_s,
        )
        self._oom_judged = self.oom.kills if self.oom else 0
        new = [f for f in explain(evidence) if f.rule in LIVE and self.live.is_new(f)]
        if not new and not hung:
            return None
        if stacks:
            self.write(self.store.add_stacks, now, trigger, stacks)
        # a hang is true since the run went quiet, not since the window ran out
        since = now - self.tracker.quiet_for(now_mono) if hung else now
        recorded = self.live.record(
            [f._replace(at=since if f.rule in _hang_rules() else now) for f in new], now
        )
        return Verdict(trigger, tuple(recorded))

    def _waits(self) -> tuple[list[Wait], dict[int, WaitParty]]:
        """What the job's blocked threads wait for (probes.waits), read only once the run is judged hung."""
        from jobwarden.probes.waits import blocked_waits
        from jobwarden.shim.tree.whosejob import with_jobs

        members = list(self.tree.members.values())
        parents = {m.pid: m.ppid for m in members}
        waits, parties = blocked_waits(parents, parents, self.procfs)
        return waits, with_jobs(parties, self.store, self.procfs, self.job.id)

    def _lock_sites(self, stacks: Sequence[ProcessStack]) -> dict[tuple[str, int], LockSite]:
        """The `with` locks around the hung threads' lines (probes.withlocks), read only when hung."""
        from jobwarden.probes.withlocks import lock_sites

        return lock_sites(stacks, self.procfs)

    def _with_owners(
        self, stacks: list[ProcessStack], sites: dict[tuple[str, int], LockSite]
    ) -> tuple[list[ProcessStack], dict[tuple[str, int], LockSite]]:
        """The stacks again, with each frame's `self` (py-spy --locals), of the processes whose idle
        threads wait for and hold an instance's lock of one class (`with self._lock:`): only the objects
        tell whether it is one lock. A second pause of those processes alone (--locals costs 10x a dump
        of deep stacks with large locals: measurements.md), within OWNERS_TIMEOUT_S."""
        from jobwarden.probes.stacks import capture_stacks
        from jobwarden.probes.withlocks import wanting_owners

        pids = wanting_owners(stacks, sites)
        if not pids:
            return stacks, sites
        again = capture_stacks(
            pids, procfs=self.procfs, py_dir=self.py_dir, timeout_s=OWNERS_TIMEOUT_S, owners=True
        )
        fresh = {ps.pid: ps for ps in again if ps.threads}
        stacks = [fresh.get(ps.pid, ps) for ps in stacks]
        return stacks, {**sites, **self._lock_sites([fresh[p] for p in fresh])} if fresh else sites

    def _feed_sites(self, stacks: Sequence[ProcessStack]) -> dict[tuple[str, int], FeedSite]:
        """The queues, events and conditions the hung threads wait on (probes.feeds), read only when hung."""
        from jobwarden.probes.feeds import feed_sites

        return feed_sites(stacks, self.procfs)

    def _log_tail(self) -> tuple[str, ...]:
        from jobwarden.store.logfiles import tail_lines

        path = self.layout.output_log(self.job.id, self.run)
        return tuple(b.decode("utf-8", "replace").rstrip("\n") for b in tail_lines(path, LOG_TAIL_LINES))

    def _write_now(self, method: Callable[..., object], *args: object) -> bool:
        try:
            method(self.job.id, self.run, *args)
        except StoreError:
            return False
        return True

    def facts(self, snaps: Sequence[ProcessSnapshot]) -> tuple[ProcessFacts, ...]:
        from jobwarden.observations import ProcessFacts
        from jobwarden.probes.pyhooks import read_adverts

        adverts = read_adverts(self.py_dir)
        facts = []
        for s in snaps:
            try:
                threads = tuple(self.procfs.thread_states(s.pid))
                wchan = self.procfs.wchan(s.pid)  # judging is rare: worth one more read per process
                exe = self.procfs.exe_name(s.pid) or ""
            except (ProcessGone, AccessDenied):
                continue
            facts.append(
                ProcessFacts(
                    pid=s.pid,
                    ppid=s.ppid,
                    cmdline=s.cmdline,
                    state=s.state,
                    thread_states=threads,
                    wchan=wchan,
                    is_python=s.pid in adverts or exe.startswith("python"),
                    started_at=self._boot + s.start_time / self.procfs.ticks_per_s,
                    is_main=s.pid == self.main_pid,
                    rank=s.ranks.rank if s.ranks else None,
                )
            )
        return tuple(facts)


def _main(main: Member | None) -> set[int]:
    return {main.pid} if main else set()

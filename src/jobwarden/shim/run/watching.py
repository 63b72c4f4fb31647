"""Watching a run, one part of the supervisor: the loop over the job's whole tree. It samples the tree,
collects every exit, judges (the diagnosis, the speed rules), and notices when the run must end: a stop
request, --timeout, --mem-limit, a hang with --on-hang stop|restart. State transitions are marked
`# a -> b`."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from jobwarden.model import EndReason, ProcessEnd, ProcessSnapshot
from jobwarden.shim.record.recorder import log
from jobwarden.shim.run.pacing import KernelPace, Pace, idle_cap
from jobwarden.shim.run.signals import Signals
from jobwarden.shim.run.state import RunState, StopRequest
from jobwarden.verdict.signs import CPU_FLOOR_PERCENT

if TYPE_CHECKING:  # imported where used: the shim must answer `run` before it loads the diagnosis
    from jobwarden.observations import OomEvidence
    from jobwarden.shim.record.logcap import TrimNotes
    from jobwarden.shim.watch.diagnosis import Verdict


LOG_CAP_CHECK_S = 0.1  # while a log grows by an eighth of its cap a tick, its cap is looked at this often
RANKS_WRITE_S = 2.0  # the per-rank rows of `status` rewritten at most this often


def _hang_rules() -> frozenset[str]:
    from jobwarden.rules.table import ENDS_WITH_THE_HANG  # loaded with the diagnosis already

    return ENDS_WITH_THE_HANG


def _cpu_busy(snaps: list[ProcessSnapshot]) -> bool:
    """The job's processes used a CPU this tick, as the watchdog counts it."""
    return sum(s.cpu_percent or 0.0 for s in snaps) >= CPU_FLOOR_PERCENT


class Watching:
    def __init__(self, state: RunState, signals: Signals) -> None:
        self.state, self.signals = state, signals
        self.kernel_pace = KernelPace()  # when the host's process events may wake the loop
        self._trims: TrimNotes | None = None  # --log-max: what was dropped, said in `status`
        self._log_due: float | None = None  # a look at the log's cap before the next tick (a fast writer)
        self.speed_off = False  # JOBWARDEN_SPEED=off
        self._ranks_at = -RANKS_WRITE_S
        self._ranks_shown = False  # the ranks file holds rows (written empty once they are gone)

    def watch(self) -> None:
        """Until the main process has ended and the tree is empty, or the run must be stopped."""
        pace = Pace(self.state.clock.monotonic())
        # a stop a tick decided (a hang with --on-hang stop) ends the loop at once, not a tick later
        while (
            not self.state.stop
            and self.state.main_status is None
            and (self.state.main is not None or self.state.tree.members)
        ):
            self._wait_for_news(pace.next_tick)
            if self.state.stop or self.state.main_status is not None:
                break
            if not self.state.main and not self.state.tree.members:
                break
            if self.state.timeout_at is not None and self.state.clock.monotonic() >= self.state.timeout_at:
                self.state.stop = StopRequest(EndReason.TIMEOUT, self.state.job.options.grace_s)
                break
            if self._log_due is not None and self.state.clock.monotonic() >= self._log_due:
                self._cap_log()
            if self.state.clock.monotonic() >= pace.next_tick:
                self._paced_tick(pace)

    def _wait_for_news(self, next_tick: float) -> None:
        """Sleep until the next tick, a signal, a member's death, or a birth or death event, and take
        in what came. Every member's pidfd is waited on: a worker's death wakes the loop at once; the
        events too, so that a short-lived process is held (or recorded) as it happens."""
        now = self.state.clock.monotonic()
        muted_until = self.kernel_pace.muted_until(now)
        muted = muted_until is not None
        deadline = min(next_tick, self.state.timeout_at or next_tick, self._log_due or next_tick)
        if muted_until is not None:  # back to listening when the mute ends, even with no tick due
            deadline = min(deadline, muted_until)
        fds = [
            self.signals.wake_r,
            *self.state.exits.fds(kernel=not muted),
            *(m.pidfd for m in self.state.tree.members.values()),
        ]
        ready = self.state.jobos.wait(fds, deadline - now)
        self.signals.handle(self.signals.drain())
        self.collect_exits()
        woke = self.state.exits.kernel_fd() in ready
        self.kernel_pace.after_wake(self.state.clock.monotonic(), self.state.exits.take_news(), woke)

    def _paced_tick(self, pace: Pace) -> None:
        now = self.state.clock.monotonic()
        full = now >= pace.next_full
        moved = True
        try:
            moved = self._tick(full)
        except Exception:  # sampling must never end supervision
            import traceback  # only for this report: loading it would slow every `run`

            log(f"tick failed:\n{traceback.format_exc()}")
        self.state.exits.follow()  # members the scan found: the kernel sends their children's births
        # a hang judged when its window ends
        due = self.state.diag.tracker.due_at() if self.state.diag else None
        window = self.state.diag.tracker.window_s if self.state.diag else None
        pace.after_tick(self.state.clock.monotonic(), moved, idle_cap(window), due, full)

    def collect_exits(self) -> list[ProcessEnd]:
        """Record every process that ended (members, and those only an event told of) and judge."""
        main = self.state.main
        ends = self.state.exits.collect(self.state.clock.wall(), main)
        if main is not None and main.pid not in self.state.tree.members:
            status = next((e.status for e in ends if e.pid == main.pid), None)
            self.state.main_status = status if status is not None else -1
            self.state.main = None
        if ends:
            self.state.record.write(self.state.store.record_tree, self.state.clock.wall(), [], ends)
        if ends and self.state.diag and not self.state.stop:
            if any(end.status != 0 for end in ends):
                # a worker's death may be the OOM killer's: know it first
                self.poll_oom(self.state.clock.wall())
            self.act_on(
                self.state.diag.on_exits(
                    ends, self.state.clock.wall(), self.state.clock.monotonic(), self.state.main
                )
            )
        return ends

    def _tick(self, full: bool) -> bool:
        """One look at the tree; True when something moved (the pace stays at TICK_S)."""
        members = set(self.state.tree.members)
        seen_at = self.state.diag.tracker.last_progress_at if self.state.diag else None
        snaps = self._sample_and_judge(full)
        if self.state.diag is None or (self.state.progress is not None and self.state.progress.counting()):
            return True
        busy = _cpu_busy(snaps)
        return (
            busy
            or self.state.diag.tracker.last_progress_at != seen_at
            or set(self.state.tree.members) != members
        )

    def _sample_and_judge(self, full: bool) -> list[ProcessSnapshot]:
        if not self.state.record.reserve.kept:  # an adopted run's, or one the start had no room for
            self.state.record.reserve.keep()
        # someone deleted jobwarden.db-wal: its records come back
        if self.state.store.reopen_if_wal_replaced():
            log("the database's write-ahead log was deleted or replaced: reopened the database")
            self.state.record.event(
                "store-reopened", self.state.clock.wall(), reason="write-ahead log deleted"
            )
        self.state.tree.discover(full=full)
        now = self.state.clock.wall()
        snaps = self._with_gpu_memory(self.state.tree.sample(now))
        gpu = self.state.diag.gpu if self.state.diag else None
        progress = self._watch_progress(snaps, now)
        reading = self.state.sampler.reading(now, snaps, self.state.tree.members.values(), gpu, progress)
        self.state.logs.index(now)
        self.note_trims(now)
        self._log_due = (
            self.state.clock.monotonic() + LOG_CAP_CHECK_S if self.state.logs.growing_fast else None
        )
        self.state.record.check_disk(now)
        # an idle tree is not rewritten every second
        if self.state.tree.worth_recording(snaps, now) and self.state.sampler.write(now, snaps, reading):
            self.state.tree.recorded(snaps, now)
        self.state.sampler.keep_up(now)
        if full:  # the hooks' files of processes that ended: two a process, for ever, otherwise
            self.prune_py_files()
        self._watch_memory(snaps, now)
        if self.state.notifier is not None:  # a webhook that fails is said in `status`, not only in shim.log
            from jobwarden.shim.record.notify import record_outcomes

            record_outcomes(self.state.store, self.state.job.id, self.state.notifier, log)
        if self.state.speed is None:
            self._start_speed_if_working(snaps, progress)
        if self.state.speed is not None:
            self._watch_speed(snaps, progress, now)
        if self.state.diag:
            self.act_on(self.state.diag.on_tick(snaps, now, self.state.clock.monotonic()))
        self.state.autoprofile.poll()
        self.record_fingerprint()
        return snaps

    def record_fingerprint(self, final: bool = False) -> None:
        """Once its helpers are done, the fingerprint is made and written. `final`, at the run's end:
        they are waited for a moment (an engine's stop spends none of its budget on them)."""
        task = self.state.fingerprint
        if task is None or (not final and not task.done()):
            return
        self.state.fingerprint = None
        try:
            if final:
                from jobwarden.shim.record.fingerprint import FINISH_WAIT_S

                engine_stop = self.state.stop is not None and self.state.stop.reason == EndReason.ENGINE_STOP
                task.wait(0.0 if engine_stop else FINISH_WAIT_S)
            found = task.result(self.state.diag.gpu if self.state.diag else None)
        except Exception as err:  # a bug of ours must cost the fingerprint, never the supervision
            log(f"fingerprint not taken: {type(err).__name__}: {err}")
            return
        finally:
            task.close()
        self.state.record.write(self.state.store.set_fingerprint, self.state.clock.wall(), found)
        missing = "; ".join(f"{part}: {why}" for part, why in found.unknown)
        log(f"fingerprint taken in {task.elapsed_ms():.0f} ms" + (f", unknown: {missing}" if missing else ""))

    def prune_py_files(self) -> None:
        try:
            self.state.pyfiles.prune({m.pid: m.ident.start_time for m in self.state.tree.members.values()})
        except Exception as err:  # housekeeping: never the supervisor's end
            log(f"pruning the hooks' files failed: {type(err).__name__}: {err}")

    def _cap_log(self) -> None:
        """Between ticks, while the log grows fast: keep it within --log-max (one stat, a trim if due)."""
        self.state.logs.cap_now()
        self.note_trims(self.state.clock.wall())
        self._log_due = self.state.clock.monotonic() + LOG_CAP_CHECK_S

    def note_trims(self, now: float, final: bool = False) -> None:
        """What --log-max dropped, as events (shim.record.logcap, loaded at the first trim)."""
        if self.state.logs.trim is None:
            return
        if self._trims is None:
            from jobwarden.shim.record.logcap import TrimNotes

            self._trims = TrimNotes(self.state.logs, self.state.record)
        self._trims.note(now, self.state.clock.monotonic(), final)

    def _start_speed_if_working(self, snaps: list[ProcessSnapshot], progress: Any) -> None:
        """The speed findings (shim.watch.speedwatch), recorded beside the diagnosis's own live findings, once
        the job works: it uses a CPU, waits on a disk, holds a GPU or was given one (one it never uses is
        a finding), or has printed anything. A job that only waits in silence (a server between requests,
        a `sleep`) has no speed to judge: its supervisor keeps no counters and takes no stack samples."""
        live = getattr(self.state.diag, "live", None)  # the loop's fake diagnosis keeps none
        if live is None or self.speed_off:
            return
        usage = self.state.diag.gpu.usage if self.state.diag and self.state.diag.gpu else None
        waits_on_disk = any(s.state == "D" for s in snaps)
        working = _cpu_busy(snaps) or waits_on_disk or bool(self.state.gpu_env or (usage and usage.gpus))
        if not (working or progress is not None or self.state.logs.size > 0):  # the log: indexed this tick
            return
        from jobwarden.shim.watch.speedwatch import SpeedWatch, claimed_gpus, speed_enabled

        if not speed_enabled():
            self.speed_off = True
            return
        self.state.speed = SpeedWatch(
            self.state.procfs,
            live,
            claimed_gpus(self.state.gpu_env),
            memory_cgroup=self.state.cgroup,
            py_dir=self.state.pyfiles.py_dir,
        )

    def _watch_progress(self, snaps: list[ProcessSnapshot], now: float) -> Any:
        """The run's progress this tick (None without any); busy: CPU or GPU at work, as the watchdog
        counts them."""
        if self.state.progress is None:
            return None
        from jobwarden.verdict.signs import GPU_FLOOR_PERCENT

        usage = self.state.diag.gpu.usage if self.state.diag and self.state.diag.gpu else None
        gpu_util = usage.max_utilization if usage else None
        busy = _cpu_busy(snaps) or (gpu_util is not None and gpu_util >= GPU_FLOOR_PERCENT)
        return self.state.progress.tick(
            now, self.state.clock.monotonic(), list(self.state.tree.members), busy
        )

    def _write_ranks(self, now: float) -> None:
        """`status`'s per-rank rows (store.rankfile), every RANKS_WRITE_S while the job has ranks."""
        assert self.state.speed is not None
        ranks = self.state.speed.ranks
        if (not ranks and not self._ranks_shown) or now - self._ranks_at < RANKS_WRITE_S:
            return
        from jobwarden.store.rankfile import write_ranks

        self._ranks_at = now
        rows = ranks.rows(self.state.job.options.node or socket.gethostname().split(".")[0])
        if write_ranks(self.state.layout.ranks_file(self.state.job.id, self.state.run), rows, now):
            self._ranks_shown = bool(rows)

    def _watch_speed(self, snaps: list[ProcessSnapshot], progress: Any, now: float) -> None:
        """The speed rules, judged every few seconds; a speed finding that appears is a `slowed` event."""
        assert self.state.speed is not None
        if self.state.main is not None:
            self.state.speed.main_pid = self.state.main.pid
        elif self.state.speed.main_pid not in self.state.tree.members:
            self.state.speed.main_pid = min(self.state.tree.members, default=None)
        step = progress.step if progress is not None else None
        unit = progress.unit if progress is not None else None
        gpu = self.state.diag.gpu if self.state.diag else None
        hints = self.state.progress.rank_hints() if self.state.progress is not None else None
        new, resolved = self.state.speed.tick(
            now, self.state.clock.monotonic(), self.state.tree.members.values(), snaps, step, unit, gpu, hints
        )
        self._write_ranks(now)
        # the straggler across nodes
        if self.state.speed.judged is not None and self.state.record.group is not None:
            self.state.record.rank_views(now, self.state.speed.judged)
            self.state.speed.judged = None
        if not new and not resolved:
            return
        from jobwarden.shim.watch.diagnosis import Verdict

        self.act_on(Verdict("speed", tuple(new), tuple(resolved)))
        if new and self.state.notifier:
            from jobwarden.shim.record.notify import event_payload, job_page

            page = job_page(self.state.job.options.web_url, self.state.job.id)
            self.state.notifier.deliver(
                event_payload(
                    "slowed",
                    self.state.job.id,
                    self.state.job.name,
                    self.state.run,
                    "running",
                    finding=new[0].title,
                    page=page,
                )
            )

    def _with_gpu_memory(self, snaps: list[ProcessSnapshot]) -> list[ProcessSnapshot]:
        """Each process's GPU memory (NVML, sampled every few seconds) for `status` and the store."""
        gpu = self.state.diag.gpu if self.state.diag else None
        usage = gpu.sample(self.state.clock.monotonic(), [s.pid for s in snaps]) if gpu else None
        if usage is None:
            return snaps
        return [s._replace(gpu_memory_bytes=usage.bytes_by_pid.get(s.pid)) for s in snaps]

    def _watch_memory(self, snaps: list[Any], now: float) -> None:
        """OOM kills (counters, kernel log) and, without a cgroup limit, the --mem-limit watchdog."""
        self.poll_oom(now)
        if self.state.memory is None or self.state.stop:
            return
        over = self.state.memory.over_limit([s.pid for s in snaps], list(self.state.tree.members))
        if over:
            log(f"--mem-limit: the tree uses {over.peak_bytes} bytes, over {over.limit_bytes}: ending it")
            self._record_oom(over, now)
            # running -> stopping: SIGKILL at once, as the kernel's OOM killer would
            self.state.stop = StopRequest(EndReason.MEM_LIMIT, 0.0)

    def poll_oom(self, now: float) -> None:
        found = self.state.memory.poll(sorted(self.state.tree.every_pid())) if self.state.memory else None
        if found is not None:
            self._record_oom(found, now)

    def _record_oom(self, oom: OomEvidence, now: float) -> None:
        self.state.oom = oom
        if self.state.diag:
            self.state.diag.oom = oom
        self.state.record.event(
            "oom",
            now,
            mechanism=oom.mechanism,
            kills=oom.kills,
            limit_bytes=oom.limit_bytes,
            peak_bytes=oom.peak_bytes,
            victims=list(oom.victims),
            kernel_lines=list(oom.kernel_lines),
        )

    def act_on(self, verdict: Verdict | None) -> None:
        """Record what the diagnosis found; on a hang, apply --on-hang (dump: keep the job as it is)."""
        if verdict is None:
            return
        now = self.state.clock.wall()
        for finding in verdict.findings:
            log(f"finding {finding.rule}: {finding.summary}")
            self.state.record.event("finding", now, rule=finding.rule, pids=finding.pids)
        self._on_resolved(verdict, now)
        if not verdict.hung:
            return
        action = self.state.job.options.on_hang
        rules = [f.rule for f in verdict.findings]
        self.state.record.event("hung", now, rules=rules, action=action)
        if self.state.notifier:
            from jobwarden.shim.record.notify import event_payload, job_page

            top = verdict.findings[0] if verdict.findings else None
            page = job_page(self.state.job.options.web_url, self.state.job.id)
            title = top.title if top is not None else None
            self.state.notifier.deliver(
                event_payload(
                    "hung",
                    self.state.job.id,
                    self.state.job.name,
                    self.state.run,
                    "running",
                    finding=title,
                    page=page,
                    cause=top,
                )
            )
        if action in ("stop", "restart") and not self.state.stop:
            # running -> stopping: the stacks are stored; end the hung run (and restart it, if asked)
            self.state.stop = StopRequest(EndReason.HUNG, self.state.job.options.grace_s)
            self.state.restart_after_hang = action == "restart"

    def _on_resolved(self, verdict: Verdict, now: float) -> None:
        """Findings that stopped being true; a hang that ended is a `recovered` event (and notification)."""
        for finding in verdict.resolved:
            log(f"resolved {finding.rule}: {finding.title}")
            self.state.record.event("resolved", now, rule=finding.rule, pids=finding.pids, since=finding.at)
        if not verdict.recovered:
            return
        hang = next(f for f in verdict.resolved if f.rule in _hang_rules())
        self.state.record.event("recovered", now, rules=[f.rule for f in verdict.resolved], since=hang.at)
        if self.state.notifier:
            from jobwarden.shim.record.notify import event_payload, recovered_text

            text = recovered_text(hang.title, hang.at, now)
            self.state.notifier.deliver(
                event_payload(
                    "recovered",
                    self.state.job.id,
                    self.state.job.name,
                    self.state.run,
                    "running",
                    finding=text,
                )
            )

    def wait_members(self, timeout_s: float) -> set[int]:
        """Wait for a member to end or a signal, up to `timeout_s`; the signals received."""
        self.state.jobos.wait(
            [self.signals.wake_r, *(m.pidfd for m in self.state.tree.members.values())], timeout_s
        )
        received = self.signals.drain()
        self.collect_exits()
        return received

"""The shim's loop: watch the whole tree of a running job, sample it, collect every exit, judge, and
notice when the run must end (a stop request, --timeout, --mem-limit, a hang with --on-hang stop|restart).

The supervisor is built in three parts, one module each: this loop and the state it keeps
(`SupervisorLoop`), ending the run (shim/run/stopping.py) and starting or adopting the job
(shim/run/supervisor.py, whose `Supervisor` is the whole). State transitions are marked `# a -> b`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from typing import TYPE_CHECKING, Any, NamedTuple

from jobwarden import config
from jobwarden.clock import Clock
from jobwarden.errors import StoreError
from jobwarden.model import EndReason, ProcessEnd, ProcessSnapshot
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import HOME_ENV, JOB_ID_ENV, RUN_ENV, STORE_ENV
from jobwarden.shim.record.recorder import RunRecorder, log
from jobwarden.shim.run.enginestop import EngineLink, engine_signals
from jobwarden.shim.run.jobos import JobOS, SystemJobOS
from jobwarden.shim.run.pacing import KernelPace, Pace, idle_cap
from jobwarden.shim.tree.jobtree import Member
from jobwarden.shim.tree.pyfiles import PyFiles
from jobwarden.shim.watch.sampler import Sampler
from jobwarden.store import JobRecord, Store
from jobwarden.store.logfiles import LogWatcher
from jobwarden.verdict.signs import CPU_FLOOR_PERCENT, DEFAULT_HANG_TIMEOUT_S

if TYPE_CHECKING:  # imported where used: the shim must answer `run` before it loads the diagnosis
    from jobwarden.observations import OomEvidence
    from jobwarden.probes.oom import OomCounters
    from jobwarden.shim.admission.resources import MemoryGuard
    from jobwarden.shim.record.fingerprint import FingerprintTask
    from jobwarden.shim.record.logcap import TrimNotes
    from jobwarden.shim.record.notify import Notifier
    from jobwarden.shim.watch.diagnosis import Diagnoser, Verdict
    from jobwarden.shim.watch.progresswatch import ProgressWatch
    from jobwarden.shim.watch.speedwatch import SpeedWatch


LOG_CAP_CHECK_S = 0.1  # while a log grows by an eighth of its cap a tick, its cap is looked at this often
RANKS_WRITE_S = 2.0  # the per-rank rows of `status` rewritten at most this often


def _hang_rules() -> frozenset[str]:
    from jobwarden.rules.table import ENDS_WITH_THE_HANG  # loaded with the diagnosis already

    return ENDS_WITH_THE_HANG


def _cpu_busy(snaps: list[ProcessSnapshot]) -> bool:
    """The job's processes used a CPU this tick, as the watchdog counts it."""
    return sum(s.cpu_percent or 0.0 for s in snaps) >= CPU_FLOOR_PERCENT


class StopRequest(NamedTuple):
    reason: EndReason
    grace_s: float


class SupervisorLoop:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        run: int,
        clock: Clock,
        procfs: ProcFS,
        notifier: Notifier | None = None,
        jobos: JobOS | None = None,
    ) -> None:
        self.store, self.job, self.run, self.clock, self.procfs = store, job, run, clock, procfs
        self.layout = store.layout
        self.jobos: JobOS = jobos or SystemJobOS()
        self.pid = os.getpid()
        home = str(self.layout.home)
        self.markers = {JOB_ID_ENV: str(job.id), RUN_ENV: str(run), HOME_ENV: home, STORE_ENV: store.store_id}
        self.cgroup: JobCgroup | None = None
        self.tree = self.jobos.tree(procfs, self.pid, self.markers)
        self.main: Member | None = None
        self.main_status: int | None = None
        self.exits = self.jobos.exits(self.tree)
        self._fifo: int | None = None  # the hooks' announcements: opened before the job starts
        self._oom_before: OomCounters | None = None  # the OOM kill counters before the job started
        self.denied: dict[int, str] = {}  # pid -> why we may not signal it
        self.stop: StopRequest | None = None
        self._carried: set[int] = set()  # signals the previous attempt received and did not act on
        self.timeout_at: float | None = None
        self.logs = LogWatcher(
            self.layout.output_log(job.id, run),
            self.layout.output_index(job.id, run),
            job.options.log_cap_bytes,
        )
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.record = RunRecorder(store, job.id, run, self.logs, clock)
        self._trims: TrimNotes | None = None  # --log-max: what was dropped, said in `status`
        self._log_due: float | None = None  # a look at the log's cap before the next tick (a fast writer)
        self.kernel_pace = KernelPace()  # when the host's process events may wake the loop
        self.record.open_group(job)
        self.sampler = Sampler(procfs, self.record)
        self.pyfiles = PyFiles(self.layout.py_dir(job.id, run), procfs)
        self.diag: Diagnoser | None = None
        self.progress: ProgressWatch | None = None  # the run's step counter (shim.watch.progresswatch)
        self.speed: SpeedWatch | None = None  # why it is slow (shim.watch.speedwatch), once the job works
        self.speed_off = False  # JOBWARDEN_SPEED=off
        self._ranks_at = -RANKS_WRITE_S
        self._ranks_shown = False  # the ranks file holds rows (written empty once they are gone)
        self.fingerprint: FingerprintTask | None = None  # what the run was started with, being taken
        self.restart_after_hang = False
        self.notifier = notifier
        from jobwarden.shim.watch.autoprofile import AutoProfiler

        self.autoprofile = AutoProfiler(
            self.layout.home, job.id, run, clock.monotonic, log, note=self._note_profile
        )
        self.autoprofile.cpu_of = lambda pid: self.exits.helper_cpu_s.pop(pid, None)  # reaped in the loop
        self.tree.helpers = self._helper_pids
        self.memory: MemoryGuard | None = None
        self.oom: OomEvidence | None = None
        self.gpu_env: dict[str, str] = {}
        self.spawn_failed = False
        self.refused = False  # a GPU request this machine cannot meet, refused before `run` returned
        # attached inside an engine (Slurm, Ray): its signals come relayed by the CLI (shim.run.enginestop)
        self.engine = EngineLink(job.options, self.record, clock.monotonic) if job.options.engine else None

    def _note_profile(self, kind: str, **fields: Any) -> None:
        """What the automatic profile did (taken, with its cost; or why not), an event of the run."""
        self.record.event(kind, self.clock.wall(), **fields)

    def _helper_pids(self) -> set[int]:
        """The shim's own children, never the job's: --on-event hooks, the automatic profile, the
        fingerprint's helpers."""
        notified = self.notifier.helper_pids() if self.notifier is not None else set()
        taking = self.fingerprint.helper_pids() if self.fingerprint is not None else set()
        return notified | taking | self.autoprofile.helper_pids()

    def close(self) -> None:
        self.autoprofile.close()
        if self.fingerprint is not None:
            self.fingerprint.close()
        # unhooked first: a signal after the close (SIGCHLD of an --on-event command still being
        # delivered) made CPython write to a closed fd: "Exception ignored ... signal wakeup fd"
        self.jobos.uninstall_signals(self._wake_w)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _install_signals(self) -> None:
        self.jobos.install_signals(self._wake_w, engine_signals(self.engine))

    # --- the loop ---------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Until the main process has ended and the tree is empty, or the run must be stopped."""
        pace = Pace(self.clock.monotonic())
        # a stop a tick decided (a hang with --on-hang stop) ends the loop at once, not a tick later
        while not self.stop and self.main_status is None and (self.main is not None or self.tree.members):
            self._wait_for_news(pace.next_tick)
            if self.stop or self.main_status is not None:
                break
            if not self.main and not self.tree.members:
                break
            if self.timeout_at is not None and self.clock.monotonic() >= self.timeout_at:
                self.stop = StopRequest(EndReason.TIMEOUT, self.job.options.grace_s)
                break
            if self._log_due is not None and self.clock.monotonic() >= self._log_due:
                self._cap_log()
            if self.clock.monotonic() >= pace.next_tick:
                self._paced_tick(pace)

    def _wait_for_news(self, next_tick: float) -> None:
        """Sleep until the next tick, a signal, a member's death, or a birth or death event, and take
        in what came. Every member's pidfd is waited on: a worker's death wakes the loop at once; the
        events too, so that a short-lived process is held (or recorded) as it happens."""
        now = self.clock.monotonic()
        muted_until = self.kernel_pace.muted_until(now)
        muted = muted_until is not None
        deadline = min(next_tick, self.timeout_at or next_tick, self._log_due or next_tick)
        if muted_until is not None:  # back to listening when the mute ends, even with no tick due
            deadline = min(deadline, muted_until)
        fds = [
            self._wake_r,
            *self.exits.fds(kernel=not muted),
            *(m.pidfd for m in self.tree.members.values()),
        ]
        ready = self.jobos.wait(fds, deadline - now)
        self._handle_signals(self._drain_signals())
        self._collect_exits()
        woke = self.exits.kernel_fd() in ready
        self.kernel_pace.after_wake(self.clock.monotonic(), self.exits.take_news(), woke)

    def _paced_tick(self, pace: Pace) -> None:
        now = self.clock.monotonic()
        full = now >= pace.next_full
        moved = True
        try:
            moved = self._tick(full)
        except Exception:  # sampling must never end supervision
            import traceback  # only for this report: loading it would slow every `run`

            log(f"tick failed:\n{traceback.format_exc()}")
        self.exits.follow()  # members the scan found: the kernel sends their children's births
        due = self.diag.tracker.due_at() if self.diag else None  # a hang judged when its window ends
        window = self.diag.tracker.window_s if self.diag else None
        pace.after_tick(self.clock.monotonic(), moved, idle_cap(window), due, full)

    def _drain_signals(self) -> set[int]:
        received: set[int] = set()
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self._wake_r, 64):
                received.update(data)
        return received

    def _handle_signals(self, received: set[int]) -> None:
        if self.stop:
            return
        grace = self.job.options.grace_s
        if self.engine is not None:
            if self.engine.on_signals(received, self.main, self.clock.wall()):
                self.stop = StopRequest(EndReason.ENGINE_STOP, grace)
                return
            received = received - {signal.SIGTERM, signal.SIGINT}
        if signal.SIGUSR1 in received:
            try:
                record = self._stop_request()
            except StoreError as err:
                log(f"cannot read the stop request: {err}")
                return
            if record is not None:
                given = record.stop_grace
                self.stop = StopRequest(EndReason.STOPPED, given if given is not None else grace)
        if received & {signal.SIGTERM, signal.SIGINT}:
            log("shim received SIGTERM/SIGINT: stopping the job")
            self.stop = StopRequest(EndReason.STOPPED, grace)

    def _stop_request(self) -> Any:
        """The run whose record holds a stop request for this attempt, or None. `jobwarden stop` writes it
        on the run it saw last: between two attempts that may be the one that just ended (its end was
        being recorded, or the next run not yet made), so a request there that did not end that run is
        this one's to act on (a service restarting every 10 ms otherwise ran on, its stop lost)."""
        record = self.store.run(self.job.id, self.run)
        if record.stop_requested_at:
            return record
        if self.run <= 1:
            return None
        before = self.store.run(self.job.id, self.run - 1)
        if before.stop_requested_at and before.end_reason != EndReason.STOPPED:
            return before
        return None

    def _collect_exits(self) -> list[ProcessEnd]:
        """Record every process that ended (members, and those only an event told of) and judge."""
        main = self.main
        ends = self.exits.collect(self.clock.wall(), main)
        if main is not None and main.pid not in self.tree.members:
            status = next((e.status for e in ends if e.pid == main.pid), None)
            self.main_status = status if status is not None else -1
            self.main = None
        if ends:
            self.record.write(self.store.record_tree, self.clock.wall(), [], ends)
        if ends and self.diag and not self.stop:
            if any(end.status != 0 for end in ends):
                self._poll_oom(self.clock.wall())  # a worker's death may be the OOM killer's: know it first
            self._act_on(self.diag.on_exits(ends, self.clock.wall(), self.clock.monotonic(), self.main))
        return ends

    def _tick(self, full: bool) -> bool:
        """One look at the tree; True when something moved (the pace stays at TICK_S)."""
        members = set(self.tree.members)
        seen_at = self.diag.tracker.last_progress_at if self.diag else None
        snaps = self._sample_and_judge(full)
        if self.diag is None or (self.progress is not None and self.progress.counting()):
            return True
        busy = _cpu_busy(snaps)
        return busy or self.diag.tracker.last_progress_at != seen_at or set(self.tree.members) != members

    def _sample_and_judge(self, full: bool) -> list[ProcessSnapshot]:
        if not self.record.reserve.kept:  # an adopted run's, or one the start had no room for
            self.record.reserve.keep()
        if self.store.reopen_if_wal_replaced():  # someone deleted jobwarden.db-wal: its records come back
            log("the database's write-ahead log was deleted or replaced: reopened the database")
            self.record.event("store-reopened", self.clock.wall(), reason="write-ahead log deleted")
        self.tree.discover(full=full)
        now = self.clock.wall()
        snaps = self._with_gpu_memory(self.tree.sample(now))
        gpu = self.diag.gpu if self.diag else None
        progress = self._watch_progress(snaps, now)
        reading = self.sampler.reading(now, snaps, self.tree.members.values(), gpu, progress)
        self.logs.index(now)
        self.note_trims(now)
        self._log_due = self.clock.monotonic() + LOG_CAP_CHECK_S if self.logs.growing_fast else None
        self.record.check_disk(now)
        # an idle tree is not rewritten every second
        if self.tree.worth_recording(snaps, now) and self.sampler.write(now, snaps, reading):
            self.tree.recorded(snaps, now)
        self.sampler.keep_up(now)
        if full:  # the hooks' files of processes that ended: two a process, for ever, otherwise
            self.prune_py_files()
        self._watch_memory(snaps, now)
        if self.notifier is not None:  # a webhook that fails is said in `status`, not only in shim.log
            from jobwarden.shim.record.notify import record_outcomes

            record_outcomes(self.store, self.job.id, self.notifier, log)
        if self.speed is None:
            self._start_speed_if_working(snaps, progress)
        if self.speed is not None:
            self._watch_speed(snaps, progress, now)
        if self.diag:
            self._act_on(self.diag.on_tick(snaps, now, self.clock.monotonic()))
        self.autoprofile.poll()
        self.record_fingerprint()
        return snaps

    def start_fingerprint(self, env: dict[str, str]) -> None:
        """Its helpers started, once `run` has its answer (shim.record.fingerprint); never at the job's
        cost."""
        if os.environ.get(config.FINGERPRINT_ENV, "on") == "off":
            return
        try:
            self.fingerprint = self.jobos.fingerprint(self.job, env, self.clock.monotonic)
        except Exception as err:
            log(f"fingerprint not taken: {type(err).__name__}: {err}")

    def record_fingerprint(self, final: bool = False) -> None:
        """Once its helpers are done, the fingerprint is made and written. `final`, at the run's end:
        they are waited for a moment (an engine's stop spends none of its budget on them)."""
        task = self.fingerprint
        if task is None or (not final and not task.done()):
            return
        self.fingerprint = None
        try:
            if final:
                from jobwarden.shim.record.fingerprint import FINISH_WAIT_S

                engine_stop = self.stop is not None and self.stop.reason == EndReason.ENGINE_STOP
                task.wait(0.0 if engine_stop else FINISH_WAIT_S)
            found = task.result(self.diag.gpu if self.diag else None)
        except Exception as err:  # a bug of ours must cost the fingerprint, never the supervision
            log(f"fingerprint not taken: {type(err).__name__}: {err}")
            return
        finally:
            task.close()
        self.record.write(self.store.set_fingerprint, self.clock.wall(), found)
        missing = "; ".join(f"{part}: {why}" for part, why in found.unknown)
        log(f"fingerprint taken in {task.elapsed_ms():.0f} ms" + (f", unknown: {missing}" if missing else ""))

    def prune_py_files(self) -> None:
        try:
            self.pyfiles.prune({m.pid: m.ident.start_time for m in self.tree.members.values()})
        except Exception as err:  # housekeeping: never the supervisor's end
            log(f"pruning the hooks' files failed: {type(err).__name__}: {err}")

    def _cap_log(self) -> None:
        """Between ticks, while the log grows fast: keep it within --log-max (one stat, a trim if due)."""
        self.logs.cap_now()
        self.note_trims(self.clock.wall())
        self._log_due = self.clock.monotonic() + LOG_CAP_CHECK_S

    def note_trims(self, now: float, final: bool = False) -> None:
        """What --log-max dropped, as events (shim.record.logcap, loaded at the first trim)."""
        if self.logs.trim is None:
            return
        if self._trims is None:
            from jobwarden.shim.record.logcap import TrimNotes

            self._trims = TrimNotes(self.logs, self.record)
        self._trims.note(now, self.clock.monotonic(), final)

    def _start_speed_if_working(self, snaps: list[ProcessSnapshot], progress: Any) -> None:
        """The speed findings (shim.watch.speedwatch), recorded beside the diagnosis's own live findings, once
        the job works: it uses a CPU, waits on a disk, holds a GPU or was given one (one it never uses is
        a finding), or has printed anything. A job that only waits in silence (a server between requests,
        a `sleep`) has no speed to judge: its supervisor keeps no counters and takes no stack samples."""
        live = getattr(self.diag, "live", None)  # the loop's fake diagnosis keeps none
        if live is None or self.speed_off:
            return
        usage = self.diag.gpu.usage if self.diag and self.diag.gpu else None
        waits_on_disk = any(s.state == "D" for s in snaps)
        working = _cpu_busy(snaps) or waits_on_disk or bool(self.gpu_env or (usage and usage.gpus))
        if not (working or progress is not None or self.logs.size > 0):  # the log: indexed this tick
            return
        from jobwarden.shim.watch.speedwatch import SpeedWatch, claimed_gpus, speed_enabled

        if not speed_enabled():
            self.speed_off = True
            return
        self.speed = SpeedWatch(self.procfs, live, claimed_gpus(self.gpu_env), memory_cgroup=self.cgroup)

    def hang_window(self) -> float | None:
        window = self.job.options.hang_timeout_s
        return (DEFAULT_HANG_TIMEOUT_S if window is None else window) or None

    def _watch_progress(self, snaps: list[ProcessSnapshot], now: float) -> Any:
        """The run's progress this tick (None without any); busy: CPU or GPU at work, as the watchdog
        counts them."""
        if self.progress is None:
            return None
        from jobwarden.verdict.signs import GPU_FLOOR_PERCENT

        usage = self.diag.gpu.usage if self.diag and self.diag.gpu else None
        gpu_util = usage.max_utilization if usage else None
        busy = _cpu_busy(snaps) or (gpu_util is not None and gpu_util >= GPU_FLOOR_PERCENT)
        return self.progress.tick(now, self.clock.monotonic(), list(self.tree.members), busy)

    def _write_ranks(self, now: float) -> None:
        """`status`'s per-rank rows (store.rankfile), every RANKS_WRITE_S while the job has ranks."""
        assert self.speed is not None
        ranks = self.speed.ranks
        if (not ranks and not self._ranks_shown) or now - self._ranks_at < RANKS_WRITE_S:
            return
        from jobwarden.store.rankfile import write_ranks

        self._ranks_at = now
        rows = ranks.rows(self.job.options.node or socket.gethostname().split(".")[0])
        if write_ranks(self.layout.ranks_file(self.job.id, self.run), rows, now):
            self._ranks_shown = bool(rows)

    def _watch_speed(self, snaps: list[ProcessSnapshot], progress: Any, now: float) -> None:
        """The speed rules, judged every few seconds; a speed finding that appears is a `slowed` event."""
        assert self.speed is not None
        if self.main is not None:
            self.speed.main_pid = self.main.pid
        elif self.speed.main_pid not in self.tree.members:
            self.speed.main_pid = min(self.tree.members, default=None)
        step = progress.step if progress is not None else None
        unit = progress.unit if progress is not None else None
        gpu = self.diag.gpu if self.diag else None
        hints = self.progress.rank_hints() if self.progress is not None else None
        new, resolved = self.speed.tick(
            now, self.clock.monotonic(), self.tree.members.values(), snaps, step, unit, gpu, hints
        )
        self._write_ranks(now)
        if self.speed.judged is not None and self.record.group is not None:  # the straggler across nodes
            self.record.rank_views(now, self.speed.judged)
            self.speed.judged = None
        if not new and not resolved:
            return
        from jobwarden.shim.watch.diagnosis import Verdict

        self._act_on(Verdict("speed", tuple(new), tuple(resolved)))
        if new and self.notifier:
            from jobwarden.shim.record.notify import event_payload, job_page

            page = job_page(self.job.options.web_url, self.job.id)
            self.notifier.deliver(
                event_payload(
                    "slowed", self.job.id, self.job.name, self.run, "running", finding=new[0].title, page=page
                )
            )

    def _with_gpu_memory(self, snaps: list[ProcessSnapshot]) -> list[ProcessSnapshot]:
        """Each process's GPU memory (NVML, sampled every few seconds) for `status` and the store."""
        gpu = self.diag.gpu if self.diag else None
        usage = gpu.sample(self.clock.monotonic(), [s.pid for s in snaps]) if gpu else None
        if usage is None:
            return snaps
        return [s._replace(gpu_memory_bytes=usage.bytes_by_pid.get(s.pid)) for s in snaps]

    def _watch_memory(self, snaps: list[Any], now: float) -> None:
        """OOM kills (counters, kernel log) and, without a cgroup limit, the --mem-limit watchdog."""
        self._poll_oom(now)
        if self.memory is None or self.stop:
            return
        over = self.memory.over_limit([s.pid for s in snaps], list(self.tree.members))
        if over:
            log(f"--mem-limit: the tree uses {over.peak_bytes} bytes, over {over.limit_bytes}: ending it")
            self._record_oom(over, now)
            # running -> stopping: SIGKILL at once, as the kernel's OOM killer would
            self.stop = StopRequest(EndReason.MEM_LIMIT, 0.0)

    def _poll_oom(self, now: float) -> None:
        found = self.memory.poll(sorted(self.tree.every_pid())) if self.memory else None
        if found is not None:
            self._record_oom(found, now)

    def _record_oom(self, oom: OomEvidence, now: float) -> None:
        self.oom = oom
        if self.diag:
            self.diag.oom = oom
        self.record.event(
            "oom",
            now,
            mechanism=oom.mechanism,
            kills=oom.kills,
            limit_bytes=oom.limit_bytes,
            peak_bytes=oom.peak_bytes,
            victims=list(oom.victims),
            kernel_lines=list(oom.kernel_lines),
        )

    def _act_on(self, verdict: Verdict | None) -> None:
        """Record what the diagnosis found; on a hang, apply --on-hang (dump: keep the job as it is)."""
        if verdict is None:
            return
        now = self.clock.wall()
        for finding in verdict.findings:
            log(f"finding {finding.rule}: {finding.summary}")
            self.record.event("finding", now, rule=finding.rule, pids=finding.pids)
        self._on_resolved(verdict, now)
        if not verdict.hung:
            return
        action = self.job.options.on_hang
        rules = [f.rule for f in verdict.findings]
        self.record.event("hung", now, rules=rules, action=action)
        if self.notifier:
            from jobwarden.shim.record.notify import event_payload, job_page

            top = verdict.findings[0] if verdict.findings else None
            page = job_page(self.job.options.web_url, self.job.id)
            title = top.title if top is not None else None
            self.notifier.deliver(
                event_payload(
                    "hung",
                    self.job.id,
                    self.job.name,
                    self.run,
                    "running",
                    finding=title,
                    page=page,
                    cause=top,
                )
            )
        if action in ("stop", "restart") and not self.stop:
            # running -> stopping: the stacks are stored; end the hung run (and restart it, if asked)
            self.stop = StopRequest(EndReason.HUNG, self.job.options.grace_s)
            self.restart_after_hang = action == "restart"

    def _on_resolved(self, verdict: Verdict, now: float) -> None:
        """Findings that stopped being true; a hang that ended is a `recovered` event (and notification)."""
        for finding in verdict.resolved:
            log(f"resolved {finding.rule}: {finding.title}")
            self.record.event("resolved", now, rule=finding.rule, pids=finding.pids, since=finding.at)
        if not verdict.recovered:
            return
        hang = next(f for f in verdict.resolved if f.rule in _hang_rules())
        self.record.event("recovered", now, rules=[f.rule for f in verdict.resolved], since=hang.at)
        if self.notifier:
            from jobwarden.shim.record.notify import event_payload, recovered_text

            text = recovered_text(hang.title, hang.at, now)
            self.notifier.deliver(
                event_payload("recovered", self.job.id, self.job.name, self.run, "running", finding=text)
            )

    def _wait_members(self, timeout_s: float) -> set[int]:
        """Wait for a member to end or a signal, up to `timeout_s`; the signals received."""
        self.jobos.wait([self._wake_r, *(m.pidfd for m in self.tree.members.values())], timeout_s)
        received = self._drain_signals()
        self._collect_exits()
        return received

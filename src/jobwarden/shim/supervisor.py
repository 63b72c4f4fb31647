"""The shim's loop: start (or adopt) the job, watch its whole tree, record how it ended, leave nothing.

State transitions are marked `# a -> b`. The shim writes every state change to the store; the CLI only
reads them, except to mark a run `lost` when this process is found dead.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
from typing import TYPE_CHECKING, Any, NamedTuple

from jobwarden import config
from jobwarden.clock import Clock
from jobwarden.errors import AccessDenied, StoreError
from jobwarden.hooks import heartbeat_env, hook_env
from jobwarden.model import UNFINISHED_STATES, EndReason, JobState, ProcessEnd, ProcessSnapshot, Survivor
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.cgroup import JobCgroup, cgroup_path, create_job_cgroup, find_job_cgroup
from jobwarden.osapi.process import ENGINE_SIGNALS, SpawnError, spawn_job
from jobwarden.osapi.procfs import ProcFS, why_still_alive
from jobwarden.osapi.waiting import wait_readable
from jobwarden.paths import HOME_ENV, JOB_ID_ENV, RUN_ENV, ensure_private_dir
from jobwarden.shim.enginestop import EngineLink, engine_signals
from jobwarden.shim.exits import ExitCollector
from jobwarden.shim.recorder import RunRecorder, end_fields, log
from jobwarden.shim.sampler import Sampler
from jobwarden.shim.sightings import FIFO_NAME, Sightings, open_fifo
from jobwarden.shim.tree import JobTree, Member
from jobwarden.shim.watchdog import DEFAULT_HANG_TIMEOUT_S
from jobwarden.store import JobRecord, Store
from jobwarden.store.logfiles import LogWatcher

if TYPE_CHECKING:  # imported where used: the shim must answer `run` before it loads the diagnosis
    from jobwarden.observations import OomEvidence
    from jobwarden.shim.diagnosis import Diagnoser, Verdict
    from jobwarden.shim.notify import Notifier
    from jobwarden.shim.resources import MemoryGuard

ADMIT_RETRY_S = 2.0  # a queued run asks NVML and the store again this often
_HANDLED_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# Helpers that exit on their own when their last user does ("from multiprocessing.resource_tracker import
# main; main(5)"), and how long they get to do so before they count as orphans.
_SELF_ENDING = ("resource_tracker import main", "forkserver import main", "semaphore_tracker import main")
TRACKER_GRACE_S = 2.0


class StopRequest(NamedTuple):
    reason: EndReason
    grace_s: float


class Supervisor:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        run: int,
        clock: Clock,
        procfs: ProcFS,
        notifier: Notifier | None = None,
    ) -> None:
        self.store, self.job, self.run, self.clock, self.procfs = store, job, run, clock, procfs
        self.layout = store.layout
        self.pid = os.getpid()
        self.markers = {JOB_ID_ENV: str(job.id), RUN_ENV: str(run), HOME_ENV: str(self.layout.home)}
        self.cgroup: JobCgroup | None = None
        self.tree = JobTree(procfs, self.pid, self.markers)
        self.main: Member | None = None
        self.main_status: int | None = None
        self.exits = ExitCollector(self.tree)
        self._fifo: int | None = None  # the hooks' announcements: opened before the job starts
        self.denied: dict[int, str] = {}  # pid -> why we may not signal it
        self.stop: StopRequest | None = None
        self.timeout_at: float | None = None
        self.logs = LogWatcher(self.layout.output_log(job.id, run), self.layout.output_index(job.id, run))
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.record = RunRecorder(store, job.id, run, self.logs, clock)
        self.record.open_group(job)
        self.sampler = Sampler(procfs, self.record)
        self.diag: Diagnoser | None = None
        self.restart_after_hang = False
        self.notifier = notifier
        if notifier is not None:
            self.tree.helpers = notifier.helper_pids
        self.memory: MemoryGuard | None = None
        self.oom: OomEvidence | None = None
        self.gpu_env: dict[str, str] = {}
        self.spawn_failed = False
        # attached inside an engine (Slurm, Ray): its signals come relayed by the CLI (shim.enginestop)
        self.engine = EngineLink(job.options, self.record, clock.monotonic) if job.options.engine else None

    # --- starting ---------------------------------------------------------------------------------

    def launch(self, report_fd: int) -> int:
        """Start the job as our child and supervise it; returns the shim's exit code. The process is a
        child subreaper already (control.shimproc)."""
        self._install_signals()
        shim_start = self.procfs.stat(self.pid).start_time
        # Under Slurm no memory cgroup of ours: nested in Slurm's task cgroup it would hide an OOM from
        # Slurm (FAILED instead of OUT_OF_MEMORY); the OOM evidence comes from the enclosing cgroup
        nest = self.job.options.engine != "slurm"
        if nest and os.environ.get(config.CGROUP_ENV, "auto") != "off":
            self.cgroup = create_job_cgroup(f"jobwarden-{self.pid}")
        self.tree.cgroup = self.cgroup
        if self.job.options.mem_limit_bytes:  # before the job starts: the limit must hold from its start
            self._guard_memory()
        shim_fields: dict[str, Any] = {
            "shim_pid": self.pid,
            "shim_start": shim_start,
            "containment": self._containment(),
        }
        if self.job.options.wants_gpus:
            self.store.update_run(self.job.id, self.run, **shim_fields)
            admitted, reported = self._wait_for_gpus(report_fd)
            if not admitted:
                return self._end_unstarted()
            if reported:
                report_fd = -1  # answered already: the run was queued
        env = self._job_env()
        self._listen_for_births()  # before the job exists: its first child may live a millisecond
        try:
            pid = spawn_job(
                list(self.job.command),
                self.job.cwd,
                env,
                str(self.layout.output_log(self.job.id, self.run)),
                self._cgroup_join_file(),
            )
        except SpawnError as err:
            self.store.update_run(self.job.id, self.run, **shim_fields)
            return self._spawn_failed(err, report_fd)
        self.main = self.tree.seed_child(pid)
        now = self.clock.wall()
        # starting -> running: the pid is recorded (one transaction with the shim's own) before `run` returns
        self.store.update_run_with_event(
            self.job.id,
            self.run,
            "started",
            now,
            {"pid": pid, "containment": shim_fields["containment"]},
            state=JobState.RUNNING,
            pid=pid,
            pid_start=self.main.ident.start_time,
            started_at=now,
            **shim_fields,
        )
        _report(report_fd, {"pid": pid, "state": "running"})
        self.record.started(now, pid, self.main.ident.start_time)
        self._start_watches(pid)
        self._arm_timeout()
        return self._supervise()

    def adopt(self, report_fd: int) -> int:
        """Watch the processes of a run whose shim died: found by marker, held by pidfd."""
        self.engine = None  # an adopting shim is nobody's task: `jobwarden stop` ends it
        self._install_signals()
        record = self.store.run(self.job.id, self.run)
        self.cgroup = find_job_cgroup(cgroup_path(record.containment))
        self.tree.cgroup = self.cgroup
        if record.pid and record.pid_start and self.procfs.identity_matches(record.pid, record.pid_start):
            self.main = self.tree.seed(record.pid, session_leader=True)
        self.tree.discover(full=True)
        if not self.tree.members:
            _report(report_fd, {"error": "no process of the job is alive any more", "exit_code": 1})
            return 1
        shim_start = self.procfs.stat(self.pid).start_time
        # lost -> running: supervised again
        self.store.update_run(
            self.job.id,
            self.run,
            only_if_state=UNFINISHED_STATES,
            state=JobState.RUNNING,
            shim_pid=self.pid,
            shim_start=shim_start,
        )
        pids = sorted(self.tree.members)
        self.store.add_event(
            self.job.id, self.run, "adopted", self.clock.wall(), pids=pids, main_alive=self.main is not None
        )
        _report(report_fd, {"pid": record.pid, "state": "running", "pids": pids})
        self._start_watches(record.pid)
        self._arm_timeout(since=record.started_at)
        return self._supervise()

    def _cgroup_join_file(self) -> str | None:
        """The file the job writes "0" to, between fork and exec, to join its cgroup. On v1, `tasks`
        moves only the writing thread, which needs no global threadgroup lock; `cgroup.procs` takes it,
        and its first taker in a while waits out an RCU grace period (10-20 ms of every `run`). The
        child is single-threaded until exec, so its one thread is the whole process. v2 migrates
        between domain cgroups only through cgroup.procs."""
        if not self.cgroup:
            return None
        return str(self.cgroup.path / "tasks" if self.cgroup.version == 1 else self.cgroup.procs_file)

    def wait_backoff(self, delay_s: float) -> bool:
        """restarting: wait out the backoff before the next attempt; False if stopped meanwhile."""
        self._install_signals()
        deadline = self.clock.monotonic() + delay_s
        while self.clock.monotonic() < deadline:
            wait_readable([self._wake_r], deadline - self.clock.monotonic())
            self._handle_signals(self._drain_signals())
            if self.stop:
                return False
        return True

    def end_before_start(self) -> int:
        """A restart or queued run that was stopped before its process existed."""
        return self._end_unstarted()

    def close(self) -> None:
        # unhooked first: a signal after the close (SIGCHLD of an --on-event command still being
        # delivered) made CPython write to a closed fd: "Exception ignored ... signal wakeup fd"
        with contextlib.suppress(ValueError):  # not the main thread: it never installed the fd
            previous = signal.set_wakeup_fd(-1)
            if previous not in (-1, self._wake_w):
                signal.set_wakeup_fd(previous)  # someone else's: put it back
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _job_env(self) -> dict[str, str]:
        """The user's environment and --env values, the markers, and the Python hooks (unless
        --no-py-hooks): they load in every Python process of the job through PYTHONPATH."""
        base = {**os.environ, **self.job.env}
        heartbeat = self.layout.heartbeat_file(self.job.id, self.run)
        if self.job.options.py_hooks:
            py_dir = ensure_private_dir(self.layout.py_dir(self.job.id, self.run))
            self._fifo = open_fifo(py_dir / FIFO_NAME)  # before the job's first process announces itself
            extra = hook_env(py_dir, heartbeat, self.pid, self.job.options.mp_start, base)
        else:
            extra = heartbeat_env(heartbeat)
        return {**base, **extra, **self.gpu_env, **self.markers}

    def _wait_for_gpus(self, report_fd: int) -> tuple[bool, bool]:
        """queued -> starting once enough GPUs are free and claimed. The CLI is answered after the first
        try: `running` if it got them at once, else `queued`. Returns (admitted, answered the CLI): not
        admitted when it was stopped, or can never run here."""
        from jobwarden.shim.gpus import GpuRequest
        from jobwarden.shim.resources import GpuQueue

        request = GpuRequest.from_options(self.job.options)
        assert request is not None
        queue = GpuQueue(self.store, self.job, self.run, self.procfs, self.clock, request)
        reported = False
        while True:
            admission = queue.try_claim()
            if admission.admitted:
                self.gpu_env = admission.env
                queue.claimed(admission)
                return True, reported
            if admission.impossible:
                self.stop = StopRequest(EndReason.SPAWN_FAILED, 0)
                self.store.update_run(self.job.id, self.run, error=admission.impossible)
                _report(report_fd, {"error": admission.impossible, "exit_code": 1})
                return False, True
            queue.note_waiting(admission)
            if not reported:
                _report(report_fd, {"pid": None, "state": "queued"})
                reported = True
            wait_readable([self._wake_r], ADMIT_RETRY_S)
            self._handle_signals(self._drain_signals())
            if self.stop:
                return False, reported

    def _end_unstarted(self) -> int:
        """A queued run that never started: stopped by the user, or impossible here (not enough GPUs)."""
        now = self.clock.wall()
        stop = self.stop.reason if self.stop else None
        stopped = stop in (EndReason.STOPPED, EndReason.ENGINE_STOP)
        # queued -> stopped | failed
        self.store.update_run(
            self.job.id,
            self.run,
            state=JobState.STOPPED if stopped else JobState.FAILED,
            end_reason=stop if stop and stopped else EndReason.SPAWN_FAILED,
            ended_at=now,
            queued_reason=None,
        )
        self.store.add_event(self.job.id, self.run, "ended", now, state="stopped" if stopped else "failed")
        self.store.release_gpus(self.job.id, self.run)
        self._remove_cgroup()
        return 0

    def _guard_memory(self) -> None:
        from jobwarden.shim.resources import MemoryGuard

        self.memory = MemoryGuard(self.cgroup, self.job.options.mem_limit_bytes, self.procfs, log)

    def _start_watches(self, main_pid: int | None) -> None:
        """Right after `run` has its answer: OOM counters, the hang watchdog, GPU use. Loading them
        before would make every `run` wait for modules it does not need to return. A kill in these
        first milliseconds is still counted: a new cgroup starts at zero, and exits are collected."""
        sightings = self.exits.sightings or self._listen_for_births()  # adopted: the job runs already
        self.record.event("watching-births", self.clock.wall(), sources=sightings.sources)
        # Over already (`true`): no OOM to count in its first millisecond (unless --mem-limit watches it
        # from its start), nothing live to judge, and `run --wait` (attached runs) waits for no imports
        over = self.main is not None and pidfds.has_exited(self.main.pidfd)
        if self.memory is None and not over:
            self._guard_memory()
        if self.memory is not None:
            self.memory.start()
        if not over:
            self._start_diagnosis(main_pid)

    def _listen_for_births(self) -> Sightings:
        """The kernel's process events, and the hooks' FIFO (opened before the job started; an adopted
        run's already exists). A child that dies before the listener opens is still caught by its exit
        event's parent, or by the Python parent that reaps it."""
        if self._fifo is None and self.job.options.py_hooks:
            self._fifo = open_fifo(self.layout.py_dir(self.job.id, self.run) / FIFO_NAME)
        kernel = os.environ.get(config.PROC_EVENTS_ENV, "auto") != "off"
        self.exits.sightings = Sightings.open(self._fifo, kernel)
        self._fifo = None  # the sightings own it now
        return self.exits.sightings

    def _start_diagnosis(self, main_pid: int | None) -> None:
        from jobwarden.shim.diagnosis import Diagnoser
        from jobwarden.shim.gpuwatch import open_gpu_watch

        window = self.job.options.hang_timeout_s
        if window is None:
            window = DEFAULT_HANG_TIMEOUT_S
        self.diag = Diagnoser(
            self.store, self.job, self.run, self.procfs, self.tree, window or None, self.clock.monotonic()
        )
        self.diag.main_pid = main_pid
        self.diag.gpu = open_gpu_watch(claimed=bool(self.gpu_env))

    def _containment(self) -> str:
        if self.cgroup:
            return f"cgroup-v{self.cgroup.version} {self.cgroup.path}"
        return "subreaper+scan (no writable cgroup)"

    def _spawn_failed(self, err: SpawnError, report_fd: int) -> int:
        self.spawn_failed = True
        code = 127 if err.errno == errno.ENOENT and "execute" in str(err) else 126
        if "chdir" in str(err):
            code = 1
        now = self.clock.wall()
        # starting -> failed: nothing ran
        self.store.update_run(
            self.job.id,
            self.run,
            state=JobState.FAILED,
            started_at=now,
            ended_at=now,
            exit_code=code,
            end_reason=EndReason.SPAWN_FAILED,
            error=str(err),
        )
        self.store.add_event(self.job.id, self.run, "spawn-failed", now, error=str(err), exit_code=code)
        _report(report_fd, {"error": str(err), "exit_code": code})
        self._remove_cgroup()
        return 0

    def _arm_timeout(self, since: float | None = None) -> None:
        timeout = self.job.options.timeout_s
        if timeout:
            elapsed = self.clock.wall() - since if since else 0.0
            self.timeout_at = self.clock.monotonic() + float(timeout) - elapsed

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        for sig in _HANDLED_SIGNALS + engine_signals(self.engine):
            signal.signal(sig, lambda *_: None)  # the wakeup fd carries the signal number to the loop
        if self.engine is None:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ENGINE_SIGNALS)  # blocked by an attached fork

    # --- the loop ---------------------------------------------------------------------------------

    def _supervise(self) -> int:
        next_tick = self.clock.monotonic()
        next_full = next_tick + config.FULL_SCAN_EVERY_S
        while self.main_status is None and (self.main is not None or self.tree.members):
            now = self.clock.monotonic()
            deadline = min(next_tick, self.timeout_at or next_tick)
            # every member's pidfd: a worker's death wakes the loop at once, not at the next tick; a birth
            # or death event too, so that a short-lived process is held (or recorded) as it happens
            fds = [self._wake_r, *self.exits.fds(), *(m.pidfd for m in self.tree.members.values())]
            wait_readable(fds, deadline - now)
            self._handle_signals(self._drain_signals())
            self._collect_exits()
            if self.stop or self.main_status is not None:
                break
            if not self.main and not self.tree.members:
                break
            if self.timeout_at is not None and self.clock.monotonic() >= self.timeout_at:
                self.stop = StopRequest(EndReason.TIMEOUT, self.job.options.grace_s)
                break
            if self.clock.monotonic() >= next_tick:
                full = self.clock.monotonic() >= next_full
                try:
                    self._tick(full)
                except Exception:  # sampling must never end supervision
                    import traceback  # only for this report: loading it would slow every `run`

                    log(f"tick failed:\n{traceback.format_exc()}")
                next_tick = self.clock.monotonic() + config.TICK_S
                due = self.diag.tracker.due_at() if self.diag else None
                if due is not None:  # judge a hang when its window ends, not up to a tick later
                    next_tick = min(next_tick, max(due, self.clock.monotonic() + 0.1))
                if full:
                    next_full = self.clock.monotonic() + config.FULL_SCAN_EVERY_S
        return self._finish()

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
                record = self.store.run(self.job.id, self.run)
            except StoreError as err:
                log(f"cannot read the stop request: {err}")
                return
            if record.stop_requested_at:
                given = record.stop_grace
                self.stop = StopRequest(EndReason.STOPPED, given if given is not None else grace)
        if received & {signal.SIGTERM, signal.SIGINT}:
            log("shim received SIGTERM/SIGINT: stopping the job")
            self.stop = StopRequest(EndReason.STOPPED, grace)

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

    def _tick(self, full: bool) -> None:
        self.tree.discover(full=full)
        now = self.clock.wall()
        snaps = self._with_gpu_memory(self.tree.sample(now))
        gpu = self.diag.gpu if self.diag else None
        reading = self.sampler.reading(now, snaps, self.tree.members.values(), gpu)
        self.logs.index(now)
        self.record.check_disk(now)
        # an idle tree is not rewritten every second
        if self.tree.worth_recording(snaps, now) and self.sampler.write(now, snaps, reading):
            self.tree.recorded(snaps, now)
        self.sampler.keep_up(now)
        self._watch_memory(snaps, now)
        if self.diag:
            self._act_on(self.diag.on_tick(snaps, now, self.clock.monotonic()))

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
        if not verdict.hung:
            return
        action = self.job.options.on_hang
        rules = [f.rule for f in verdict.findings]
        self.record.event("hung", now, rules=rules, action=action)
        if self.notifier:
            from jobwarden.shim.notify import event_payload

            top = verdict.findings[0].title if verdict.findings else None
            self.notifier.deliver(
                event_payload("hung", self.job.id, self.job.name, self.run, "running", finding=top)
            )
        if action in ("stop", "restart") and not self.stop:
            # running -> stopping: the stacks are stored; end the hung run (and restart it, if asked)
            self.stop = StopRequest(EndReason.HUNG, self.job.options.grace_s)
            self.restart_after_hang = action == "restart"

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
        """SIGTERM every member, wait up to the grace (terminating newcomers too), then SIGKILL the rest."""
        self.tree.discover(full=True)
        self._signal_all(signal.SIGTERM)
        deadline = self.clock.monotonic() + grace_s
        while self.tree.members and self.clock.monotonic() < deadline:
            if signal.SIGUSR1 in self._wait_members(min(0.2, deadline - self.clock.monotonic())):
                deadline = min(deadline, self._requested_deadline())
            self._signal_all(signal.SIGTERM, only=self.tree.discover())
        for _ in range(10):
            if not self.tree.members or set(self.tree.members) <= set(self.denied):
                break
            if self.cgroup:
                with contextlib.suppress(OSError):
                    self.cgroup.kill_all()
            self._signal_all(signal.SIGKILL)
            self._wait_members(0.5)
            self.tree.discover(full=True)
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

    def _wait_members(self, timeout_s: float) -> set[int]:
        """Wait for a member to end or a signal, up to `timeout_s`; the signals received."""
        wait_readable([self._wake_r, *(m.pidfd for m in self.tree.members.values())], timeout_s)
        received = self._drain_signals()
        self._collect_exits()
        return received

    def _signal_all(self, sig: int, only: list[Member] | None = None) -> None:
        for member in list(self.tree.members.values()) if only is None else only:
            try:
                pidfds.send_signal(member.pidfd, member.pid, sig)
            except AccessDenied as err:
                self.denied[member.pid] = f"{err.message}: {err.remedy}"

    def _why_alive(self, pid: int) -> str:
        if pid in self.denied:
            return self.denied[pid]
        return why_still_alive(self.procfs, pid)

    def _remove_cgroup(self) -> None:
        if self.cgroup:
            self.cgroup.remove()


def _ends_by_itself(cmdline: str) -> bool:
    return any(helper in cmdline for helper in _SELF_ENDING)


def _report(fd: int, message: dict[str, Any]) -> None:
    """Answer the `run`/`adopt` command waiting on the handshake pipe, once."""
    if fd < 0:
        return
    with contextlib.suppress(OSError):
        os.write(fd, json.dumps(message).encode() + b"\n")
    with contextlib.suppress(OSError):
        os.close(fd)

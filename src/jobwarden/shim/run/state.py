"""One run's state, as its supervisor's parts share it: what the run is (job, run number, the store), the
handles it holds (the tree, the cgroup, the main process), the watches it keeps, and what was decided
about its end (the stop request, the deadline, a restart after a hang).

The parts that act on it (shim/run/starting.py, watching.py, ending.py, signals.py) each own one phase;
`Supervisor` (shim/run/supervisor.py) makes them and owns them. Nothing here decides anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from jobwarden.clock import Clock
from jobwarden.model import EndReason
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import HOME_ENV, JOB_ID_ENV, RUN_ENV, STORE_ENV, Layout
from jobwarden.shim.record.recorder import RunRecorder, log
from jobwarden.shim.run.enginestop import EngineLink
from jobwarden.shim.run.jobos import JobOS, SystemJobOS
from jobwarden.shim.tree.exits import ExitCollector
from jobwarden.shim.tree.jobtree import JobTree, Member
from jobwarden.shim.tree.pyfiles import PyFiles
from jobwarden.shim.watch.sampler import Sampler
from jobwarden.store import JobRecord, Store
from jobwarden.store.logfiles import LogWatcher
from jobwarden.verdict.signs import DEFAULT_HANG_TIMEOUT_S

if TYPE_CHECKING:  # imported where used: the shim must answer `run` before it loads the diagnosis
    from jobwarden.observations import OomEvidence
    from jobwarden.probes.oom import OomCounters
    from jobwarden.shim.admission.resources import MemoryGuard
    from jobwarden.shim.record.fingerprint import FingerprintTask
    from jobwarden.shim.record.notify import Notifier
    from jobwarden.shim.watch.autoprofile import AutoProfiler
    from jobwarden.shim.watch.diagnosis import Diagnoser
    from jobwarden.shim.watch.progresswatch import ProgressWatch
    from jobwarden.shim.watch.speedwatch import SpeedWatch


class StopRequest(NamedTuple):
    reason: EndReason
    grace_s: float


@dataclass
class RunState:
    # what the run is
    store: Store
    job: JobRecord
    run: int
    clock: Clock
    procfs: ProcFS
    jobos: JobOS
    layout: Layout
    pid: int  # the shim's own
    markers: dict[str, str]  # the JOBWARDEN_* variables that find the job's processes
    # the handles on the job
    tree: JobTree
    exits: ExitCollector
    logs: LogWatcher
    record: RunRecorder
    sampler: Sampler
    pyfiles: PyFiles
    autoprofile: AutoProfiler
    notifier: Notifier | None = None
    cgroup: JobCgroup | None = None
    main: Member | None = None
    main_status: int | None = None
    fifo: int | None = None  # the hooks' announcements: opened before the job starts
    oom_before: OomCounters | None = None  # the OOM kill counters before the job started
    denied: dict[int, str] = field(default_factory=dict)  # pid -> why we may not signal it
    # attached inside an engine (Slurm, Ray): its signals come relayed by the CLI (shim.run.enginestop)
    engine: EngineLink | None = None
    # the watches, started once `run` has its answer
    diag: Diagnoser | None = None
    progress: ProgressWatch | None = None  # the run's step counter (shim.watch.progresswatch)
    speed: SpeedWatch | None = None  # why it is slow (shim.watch.speedwatch), once the job works
    fingerprint: FingerprintTask | None = None  # what the run was started with, being taken
    memory: MemoryGuard | None = None
    oom: OomEvidence | None = None
    gpu_env: dict[str, str] = field(default_factory=dict)
    # what was decided
    stop: StopRequest | None = None
    timeout_at: float | None = None
    restart_after_hang: bool = False
    spawn_failed: bool = False
    refused: bool = False  # a GPU request this machine cannot meet, refused before `run` returned

    @classmethod
    def open(
        cls,
        store: Store,
        job: JobRecord,
        run: int,
        clock: Clock,
        procfs: ProcFS,
        notifier: Notifier | None = None,
        jobos: JobOS | None = None,
    ) -> RunState:
        """The state of a run about to be started or adopted: its handles made, nothing started."""
        from jobwarden.shim.watch.autoprofile import AutoProfiler

        layout = store.layout
        jobos = jobos or SystemJobOS()
        pid = os.getpid()
        home = str(layout.home)
        markers = {JOB_ID_ENV: str(job.id), RUN_ENV: str(run), HOME_ENV: home, STORE_ENV: store.store_id}
        tree = jobos.tree(procfs, pid, markers)
        logs = LogWatcher(
            layout.output_log(job.id, run), layout.output_index(job.id, run), job.options.log_cap_bytes
        )
        record = RunRecorder(store, job.id, run, logs, clock)
        record.open_group(job)
        exits = jobos.exits(tree)

        def note_profile(kind: str, **fields: Any) -> None:
            """What the automatic profile did (taken, with its cost; or why not), an event of the run."""
            record.event(kind, clock.wall(), **fields)

        autoprofile = AutoProfiler(layout.home, job.id, run, clock.monotonic, log, note=note_profile)
        autoprofile.cpu_of = lambda pid: exits.helper_cpu_s.pop(pid, None)  # reaped in the loop
        state = cls(
            store=store,
            job=job,
            run=run,
            clock=clock,
            procfs=procfs,
            jobos=jobos,
            layout=layout,
            pid=pid,
            markers=markers,
            tree=tree,
            exits=exits,
            logs=logs,
            record=record,
            sampler=Sampler(procfs, record),
            pyfiles=PyFiles(layout.py_dir(job.id, run), procfs),
            autoprofile=autoprofile,
            notifier=notifier,
            engine=EngineLink(job.options, record, clock.monotonic) if job.options.engine else None,
        )
        tree.helpers = state.helper_pids
        return state

    def helper_pids(self) -> set[int]:
        """The shim's own children, never the job's: --on-event hooks, the automatic profile, the
        fingerprint's helpers."""
        notified = self.notifier.helper_pids() if self.notifier is not None else set()
        taking = self.fingerprint.helper_pids() if self.fingerprint is not None else set()
        return notified | taking | self.autoprofile.helper_pids()

    def hang_window(self) -> float | None:
        window = self.job.options.hang_timeout_s
        return (DEFAULT_HANG_TIMEOUT_S if window is None else window) or None

"""One run's state, as its supervisor's parts share it: what the run is (job, run number, the store), the
handles it holds (the tree, the cgroup, the main process), the watches it keeps, and what was decided
about its end (the stop request, the deadline, a restart after a hang).

The parts that act on it (shim/run/starting.py, watching.py, ending.py, signals.py) each own one phase;
`Supervisor` (shim/run/supervisor.py) makes them and owns them. Nothing here decides anything.
"""

from __future__ import annotations

import os
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
    from jobwarden.shim.watch.diagnosis import Diagnoser
    from jobwarden.shim.watch.progresswatch import ProgressWatch
    from jobwarden.shim.watch.speedwatch import SpeedWatch


class StopRequest(NamedTuple):
    reason: EndReason
    grace_s: float


class RunState:
    """A plain class, not a @dataclass: `run` loads the shim before it forks (control.shimproc), and
    `dataclasses` would cost every `run` its import (tests/integration/test_joblist_cli.py)."""

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
        """The state of a run about to be started or adopted: its handles made, nothing started."""
        from jobwarden.shim.watch.autoprofile import AutoProfiler

        # what the run is
        self.store, self.job, self.run, self.clock, self.procfs = store, job, run, clock, procfs
        self.layout: Layout = store.layout
        self.jobos: JobOS = jobos or SystemJobOS()
        self.pid = os.getpid()  # the shim's own
        home = str(self.layout.home)
        # the JOBWARDEN_* variables that find the job's processes
        self.markers = {JOB_ID_ENV: str(job.id), RUN_ENV: str(run), HOME_ENV: home, STORE_ENV: store.store_id}
        # the handles on the job
        self.tree: JobTree = self.jobos.tree(procfs, self.pid, self.markers)
        self.exits: ExitCollector = self.jobos.exits(self.tree)
        self.logs = LogWatcher(
            self.layout.output_log(job.id, run),
            self.layout.output_index(job.id, run),
            job.options.log_cap_bytes,
        )
        self.record = RunRecorder(store, job.id, run, self.logs, clock)
        self.record.open_group(job)
        self.sampler = Sampler(procfs, self.record)
        self.pyfiles = PyFiles(self.layout.py_dir(job.id, run), procfs)
        self.notifier = notifier
        self.autoprofile = AutoProfiler(
            self.layout.home, job.id, run, clock.monotonic, log, note=self._note_profile
        )
        self.autoprofile.cpu_of = lambda pid: self.exits.helper_cpu_s.pop(pid, None)  # reaped in the loop
        self.tree.helpers = self.helper_pids
        self.cgroup: JobCgroup | None = None
        self.main: Member | None = None
        self.main_status: int | None = None
        self.fifo: int | None = None  # the hooks' announcements: opened before the job starts
        self.oom_before: OomCounters | None = None  # the OOM kill counters before the job started
        self.denied: dict[int, str] = {}  # pid -> why we may not signal it
        # attached inside an engine (Slurm, Ray): its signals come relayed by the CLI (shim.run.enginestop)
        self.engine: EngineLink | None = (
            EngineLink(job.options, self.record, clock.monotonic) if job.options.engine else None
        )
        # the watches, started once `run` has its answer
        self.diag: Diagnoser | None = None
        self.progress: ProgressWatch | None = None  # the run's step counter (shim.watch.progresswatch)
        self.speed: SpeedWatch | None = None  # why it is slow (shim.watch.speedwatch), once the job works
        self.fingerprint: FingerprintTask | None = None  # what the run was started with, being taken
        self.memory: MemoryGuard | None = None
        self.oom: OomEvidence | None = None
        self.gpu_env: dict[str, str] = {}
        # what was decided
        self.stop: StopRequest | None = None
        self.timeout_at: float | None = None
        self.restart_after_hang = False
        self.spawn_failed = False
        self.refused = False  # a GPU request this machine cannot meet, refused before `run` returned

    def _note_profile(self, kind: str, **fields: Any) -> None:
        """What the automatic profile did (taken, with its cost; or why not), an event of the run."""
        self.record.event(kind, self.clock.wall(), **fields)

    def helper_pids(self) -> set[int]:
        """The shim's own children, never the job's: --on-event hooks, the automatic profile, the
        fingerprint's helpers."""
        notified = self.notifier.helper_pids() if self.notifier is not None else set()
        taking = self.fingerprint.helper_pids() if self.fingerprint is not None else set()
        return notified | taking | self.autoprofile.helper_pids()

    def hang_window(self) -> float | None:
        window = self.job.options.hang_timeout_s
        return (DEFAULT_HANG_TIMEOUT_S if window is None else window) or None

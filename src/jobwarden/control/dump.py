"""`jobwarden dump JOB`: the stacks of every live process of a job, taken now and kept in the store, and
the PyTorch flight recorder of each rank that serves it (probes.flightrec), with where the ranks part.

For a job that has ended there is nothing left to look at: the last stacks stored while it ran (by an
earlier `dump`, or by the hang watchdog) are shown instead, said as such.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from jobwarden.clock import SystemClock
from jobwarden.errors import JobwardenError
from jobwarden.model import JobState, Ranks
from jobwarden.observations import ProcessStack, RankRecorder
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import flightrec
from jobwarden.probes.markers import find_marked, job_markers
from jobwarden.probes.pyhooks import settle_adverts
from jobwarden.probes.stacks import capture_stacks
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.records import StackDump

DEFAULT_TIMEOUT_S = 5.0
TRIGGER = "dump"
_NO_RANKS = Ranks(None)


@dataclass(frozen=True)
class DumpResult:
    job: JobRecord
    run: RunRecord
    at: float  # wall time the stacks were taken
    trigger: str  # "dump" for this capture; for a stored one, whoever took it ("dump", "hang"...)
    stacks: tuple[ProcessStack, ...]
    live: bool  # False: the job is not running; these are the last stacks stored while it ran
    elapsed_s: float | None = None  # how long the capture took (live only)
    ranks: dict[int, Ranks] = field(default_factory=dict)  # of the processes that are ranks, by pid
    recorders: tuple[RankRecorder, ...] = ()  # the ranks' flight recorders, read with the stacks (live)
    divergence: str | None = None  # where the recorders show the ranks parting, said as collective-hang

    def to_json(self) -> list[dict[str, object]]:
        return [{**s.to_json(), **(self.ranks.get(s.pid) or _NO_RANKS).to_json()} for s in self.stacks]


def dump_job(
    home: Path, procfs: ProcFS, job_ref: str, *, native: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S
) -> DumpResult:
    """Capture and store the stacks of the job's live processes; for an ended job, the last stored."""
    from jobwarden.control.views.joblist import refresh  # views pulls in cgroup code: only when dumping

    with Store(home) as store:
        job = store.job(job_ref)
        run = refresh(store, procfs, job, store.run(job.id))
        pids = _live_pids(store, procfs, job, run)
        py_dir = store.layout.py_dir(job.id, run.n)
        ranks = {p.pid: p.ranks for p in store.processes(job.id, run.n) if p.ranks is not None}
        if not pids:
            return replace(_last_stored(store, job, run), ranks=ranks)
    # The store is closed while the tools run: a capture may take seconds, and holds no lock meanwhile.
    started, at = time.monotonic(), SystemClock().wall()
    settle_adverts(py_dir)  # a process born this instant: its advert on the way through the shim
    asked = flightrec.request(py_dir, pids)  # answered while the stacks are taken
    stacks = capture_stacks(pids, procfs=procfs, py_dir=py_dir, native=native, timeout_s=timeout_s)
    recorders = tuple(flightrec.collect(asked)) if asked else ()
    elapsed = time.monotonic() - started
    with Store(home) as store:
        store.add_stacks(job.id, run.n, at, TRIGGER, stacks)
    return DumpResult(
        job, run, at, TRIGGER, tuple(stacks), True, elapsed, ranks, recorders, _divergence(recorders, stacks)
    )


def _divergence(recorders: tuple[RankRecorder, ...], stacks: list[ProcessStack]) -> str | None:
    """The recorders compared as collective-hang compares them on a hang (its title), None where the ranks
    agree. A dump is no verdict that the job is hung: the ranks may be moving on."""
    from jobwarden.rules.evidence import RunEvidence
    from jobwarden.rules.hang import recorded
    from jobwarden.rules.lookup import Lookup

    if len(recorders) < 2:
        return None
    ev = RunEvidence("running", None, None, None, None, stacks=tuple(stacks), recorders=recorders)
    found = recorded.finding(ev, Lookup.of(ev), "")
    return found.title if found is not None else None


def _live_pids(store: Store, procfs: ProcFS, job: JobRecord, run: RunRecord) -> list[int]:
    """The run's processes alive now, main process first, then in order of start. The shim's records are
    joined by a marker scan: a child forked since the shim's last tick is not recorded yet."""
    from jobwarden.control.views.joblist import live_processes

    if run.state.is_ended:
        return []
    found = {p.pid: p.start_time for p in live_processes(store, procfs, job, run)}
    exclude = {run.shim_pid} if run.shim_pid else set()
    markers = job_markers(str(store.layout.home), job.id, run.n)
    for st in find_marked(procfs, markers, exclude=exclude, store=store.store_id):
        found.setdefault(st.pid, st.start_time)
    found.pop(run.shim_pid or -1, None)
    return sorted(found, key=lambda pid: (pid != run.pid, found[pid], pid))


def stored_stacks(
    home: Path, job_ref: str | int, run_n: int | None, last: int
) -> tuple[JobRecord, RunRecord, list[StackDump]]:
    """The run's `last` stack dumps stored (by `dump` or the hang watchdog), newest last."""
    with Store(home) as store:
        job = store.job(job_ref)
        run = store.run(job.id, run_n)
        return job, run, store.stacks(job.id, run.n)[-last:]


def _last_stored(store: Store, job: JobRecord, run: RunRecord) -> DumpResult:
    dumps = store.stacks(job.id, run.n)
    if dumps:
        last = dumps[-1]
        return DumpResult(job, run, last.at, last.trigger, last.stacks, live=False)
    if run.state.is_ended or run.state == JobState.LOST:
        raise JobwardenError(
            f"job {job.id} is {run.state}: no process of it is left, and no stacks were taken while it ran",
            f"`jobwarden explain {job.id}` tells how it ended; stacks can only be taken from a running job",
        )
    raise JobwardenError(
        f"job {job.id} is {run.state} but none of its processes is alive right now",
        f"try again in a moment, or see `jobwarden status {job.id}`",
    )

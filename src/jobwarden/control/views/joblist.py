"""Read-side views of jobs: the job list (`ps`, the web's list, `top`), the live processes of a run, and
the one write a reader may make: marking a run `lost` when its shim is found dead. One job's whole view is
`control.views.jobstatus`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from jobwarden import config
from jobwarden.clock import SystemClock, iso
from jobwarden.control.boot.reboot import ended_by_reboot, mark_rebooted
from jobwarden.control.shimproc import shim_alive
from jobwarden.errors import AccessDenied, ProcessGone, StoreError
from jobwarden.model import (
    ACTIVE_STATES,
    ENDED_STATES,
    HUNG_RULES,
    JobState,
    ProcessSnapshot,
    root_cause_rank,
)
from jobwarden.osapi.cgroup import cgroup_path, find_job_cgroup
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.markers import find_marked, job_markers
from jobwarden.progress.model import Progress
from jobwarden.store import JobRecord, JobSummary, RunRecord, Store
from jobwarden.store.reserve import SpaceReserve, reserve_path

_WATCHED = ACTIVE_STATES  # a shim should be alive for these


def refresh(store: Store, procfs: ProcFS, job: JobRecord | JobSummary, run: RunRecord) -> RunRecord:
    """The run as it really is: a watched run whose shim is dead becomes `lost` (recorded once); one
    supervised under another boot was ended by the reboot (control.boot.reboot)."""
    if run.boot_id is not None and ended_by_reboot(procfs, run):
        return mark_rebooted(store, procfs, job, run)
    if run.state == JobState.LOST:
        _release_cgroup(run)
        # the dead shim's room for its end: nobody writes that end now (`adopt` keeps a new one)
        SpaceReserve(reserve_path(store.layout.database, job.id, run.n)).release()
    if run.state not in _WATCHED:
        return run
    if shim_alive(procfs, run.shim_pid, run.shim_start):
        return run
    created = job.created_at
    if run.shim_pid is None and SystemClock().wall() - created < config.SHIM_READY_TIMEOUT_S:
        return run  # the shim is still being started
    now = SystemClock().wall()
    # running -> lost: the shim died before it could record the end
    try:
        if store.update_run(job.id, run.n, only_if_state=_WATCHED, state=JobState.LOST):
            store.add_event(job.id, run.n, "supervisor-lost", now, shim_pid=run.shim_pid)
    except StoreError:  # a full disk: still show the truth, record it next time
        return run._replace(state=JobState.LOST)
    return store.run(job.id, run.n)


def current_run(home: Path, procfs: ProcFS, job_id: int, n: int) -> RunRecord:
    """Run `n` of job `job_id` as it really is now (`refresh`), read from the home's store."""
    with Store(home) as store:
        job = store.job(job_id)
        return refresh(store, procfs, job, store.run(job.id, n))


def lost_at_start(store: Store, procfs: ProcFS, job: JobRecord, n: int) -> int | None:
    """The shim died before it answered `run` (a job whose first act is to kill it): if the job runs,
    its processes carry the run's markers, and the record says so: started, its pid, `lost` with
    `supervisor-lost` (adoptable), never "not started". Returns the job's pid; None when nothing runs."""
    marked = find_marked(procfs, job_markers(str(store.layout.home), job.id, n), store=store.store_id)
    if not marked:
        return None
    run = store.run(job.id, n)
    if run.pid is not None:  # it had recorded the start: the run is lost like any other
        refresh(store, procfs, job, run)
        return run.pid
    main = next((st for st in marked if st.sid == st.pid), min(marked, key=lambda st: st.start_time))
    started = procfs.wall_time_of(main.start_time)
    now = SystemClock().wall()
    # starting -> lost: the job was spawned, its supervisor died before it could record that
    if store.update_run_with_event(
        job.id,
        n,
        "started",
        started,
        {"pid": main.pid, "recorded_by": "jobwarden run, after its supervisor died"},
        only_if_state=(JobState.STARTING, JobState.QUEUED),
        state=JobState.LOST,
        pid=main.pid,
        pid_start=main.start_time,
        started_at=started,
    ):
        store.add_event(job.id, n, "supervisor-lost", now, shim_pid=None)
    return main.pid


def _release_cgroup(run: RunRecord) -> None:
    """A dead shim cannot remove its job's cgroup; rmdir succeeds only once the cgroup is empty, so
    trying on every look at a lost run is safe and cleans up as soon as its last process is gone."""
    cgroup = find_job_cgroup(cgroup_path(run.containment))
    if cgroup:
        cgroup.remove()


def live_processes(store: Store, procfs: ProcFS, job: JobRecord, run: RunRecord) -> list[ProcessSnapshot]:
    """The run's processes alive now: the shim's records, identity-checked; for a lost run, by marker."""
    if run.state.is_ended:
        return []
    recorded = {(p.pid, p.start_time): p for p in store.processes(job.id, run.n, live_only=True)}
    if run.state == JobState.LOST:
        markers = job_markers(str(store.layout.home), job.id, run.n)
        stats = find_marked(procfs, markers, store=store.store_id)
    else:
        stats = []
        for pid, start in recorded:
            try:
                st = procfs.stat(pid)
            except (ProcessGone, AccessDenied):
                continue
            if st.start_time == start and st.state not in ("Z", "X"):
                stats.append(st)
    snaps = []
    for st in stats:
        rec = recorded.get((st.pid, st.start_time))
        try:
            cmdline = rec.cmdline if rec else procfs.cmdline(st.pid)
        except ProcessGone:
            continue
        snaps.append(
            ProcessSnapshot(
                pid=st.pid,
                ppid=st.ppid,
                start_time=st.start_time,
                state=st.state,
                cmdline=cmdline,
                rss_bytes=st.rss_pages * procfs.page_size,
                cpu_percent=rec.cpu_percent if rec else None,
                gpu_memory_bytes=rec.gpu_memory_bytes if rec else None,
                ranks=rec.ranks if rec else None,
            )
        )
    return snaps


class JobView(NamedTuple):
    job: JobSummary
    run: RunRecord
    cpu_percent: float | None
    rss_bytes: int | None
    # the run's verdict: an ended run's first finding as the shim stored it, else the most likely root
    # cause among the findings the shim recorded that are still true (a resolved one is history)
    finding: str | None = None  # its rule id
    finding_title: str | None = None
    # running, but its main process is gone: the shim has not recorded the end yet (for a moment, or for
    # as long as the disk holding the store is full)
    end_unrecorded: bool = False
    progress: Progress | None = None  # the run's latest, kept after it ended (how far it got)

    @property
    def hung(self) -> bool:
        """Running, and its current verdict is a hang (model.HUNG_RULES): shown so, not as `running`."""
        return self.run.state == JobState.RUNNING and self.finding in HUNG_RULES

    def summary_json(self) -> dict[str, Any]:
        r = self.run
        return {
            "id": self.job.id,
            "name": self.job.name,
            "state": str(r.state),
            "run": r.n,
            "pid": r.pid,
            "finding": self.finding,
            "finding_title": self.finding_title,
            "exit_code": r.exit_code,
            "signal": r.signal,
            "started_at": iso(r.started_at),
            "ended_at": iso(r.ended_at),
            "cpu_percent": self.cpu_percent,
            "rss_bytes": self.rss_bytes,
            "command": list(self.job.command),
            "progress": self.progress.to_json(SystemClock().wall()) if self.progress else None,
            "hung": self.hung,
            "gpu_ids": list(r.gpu_ids),
        }


def filtered_views(
    views: list[JobView], states: frozenset[str] | None, name: str | None, ended_since: float | None
) -> list[JobView]:
    """`ps --state/--name/--since`: the views whose state word is one of `states` (`hung` a running one
    with a current hang finding; `running` includes those), whose name matches the shell pattern `name`,
    and, with `ended_since`, that are not over or ended at or after it."""
    from fnmatch import fnmatchcase

    kept = []
    for v in views:
        run = v.run
        if states is not None and str(run.state) not in states and not ("hung" in states and v.hung):
            continue
        if name is not None and not fnmatchcase(v.job.name, name):
            continue
        if ended_since is not None and run.ended_at is not None and run.ended_at < ended_since:
            continue
        kept.append(v)
    return kept


def views_of(
    home: Path,
    procfs: ProcFS,
    include_ended: bool,
    *,
    limit: int | None = None,
    metrics: bool = False,
    ended_since: float | None = None,
) -> list[JobView]:
    """`job_views` read from the home's store (`ps`, `top` without a terminal, the web's list)."""
    with Store(home) as store:
        return job_views(store, procfs, include_ended, limit=limit, metrics=metrics, ended_since=ended_since)


class ListPage(NamedTuple):
    views: list[JobView]  # the page, newest first, each with its progress's metrics
    matching: int  # the jobs that match, over all pages
    state_counts: dict[str, int]  # each state's count over all jobs


def list_page(
    home: Path, procfs: ProcFS, states: frozenset[str] | None, name: str, offset: int, limit: int
) -> ListPage:
    """One page of the job list, newest first, of the jobs in `states` (None: all; as `ps --state`)
    whose name contains `name` (any case) or whose id it is. The progress's metrics (its loss) are
    decoded for the page's jobs only: 10,000 cost ~165 ms."""
    counts: dict[str, int] = {}
    with Store(home) as store:
        views = job_views(store, procfs, include_ended=True)
        for v in views:
            counts[str(v.run.state)] = counts.get(str(v.run.state), 0) + 1
        kept = filtered_views(views, states, None, None)
        matching = [v for v in reversed(kept) if _named(v, name)]
        page = matching[offset : offset + limit]
        progress = store.progress_of_runs(((v.job.id, v.run.n) for v in page), metrics=True)
    page = [v._replace(progress=progress.get((v.job.id, v.run.n))) for v in page]
    return ListPage(page, len(matching), counts)


def _named(view: JobView, name: str) -> bool:
    """The list page's search: a part of the name, any case, or the id."""
    return not name or name in view.job.name.lower() or str(view.job.id) == name


def job_views(
    store: Store,
    procfs: ProcFS,
    include_ended: bool,
    *,
    limit: int | None = None,
    offset: int = 0,
    metrics: bool = False,
    ended_since: float | None = None,
) -> list[JobView]:
    """The job list, oldest job first: each job's latest run as it really is. Without `include_ended`,
    only the jobs not over (their runs found by index: a long history costs nothing). `limit` and
    `offset` page from the newest job (limit=50: the 50 newest); without `include_ended` they page
    through the unfinished jobs. `metrics`: each progress with the metrics the job reported (for the
    JSON lists, `ps --json` and the web's; a table shows none, and 10,000 runs' cost ~25 ms to decode).
    `ended_since` (without `include_ended`): the unfinished jobs and those ended at or after it."""
    if include_ended:
        listed = store.job_list(limit=limit, offset=offset)
    elif ended_since is not None:
        listed = store.job_list(ended_since=ended_since, limit=limit, offset=offset)
    else:
        listed = store.job_list(unfinished_only=True, limit=limit, offset=offset)
    # each run's latest progress, one query for the whole list, given to each view as it is made
    progress = store.progress_of_runs(((job.id, run.n) for job, run in listed), metrics=metrics).get
    views = []
    for job, run in listed:
        if run.state in ENDED_STATES:  # most of a long list: nothing to refresh, no sample to read
            verdict = run.verdict_rule, run.verdict_title  # the shim's, stored at its end
            views.append(JobView(job, run, None, None, *verdict, False, progress((job.id, run.n))))
            continue
        run = refresh(store, procfs, job, run)
        if run.state in ENDED_STATES and not include_ended and ended_since is None:
            continue  # it ended between the query and the look at its shim
        cpu = rss = None
        if run.state in _WATCHED:
            sample = store.latest_sample(job.id, run.n)
            if sample is not None:
                cpu, rss = sample["cpu_percent"], sample["rss_bytes"]
        gone = _main_gone(procfs, run)
        verdict = run.verdict_rule, run.verdict_title
        views.append(JobView(job, run, cpu, rss, *verdict, gone, progress((job.id, run.n))))
    return _with_top_findings(store, views)


def _main_gone(procfs: ProcFS, run: RunRecord) -> bool:
    if run.state != JobState.RUNNING or not run.pid or not run.pid_start:
        return False
    return not procfs.identity_matches(run.pid, run.pid_start)


def home_disk_full(home: Path) -> int | None:
    """The free bytes of the filesystem holding the home when it is (nearly) full, else None. Then no
    shim can record anything (a run's end waits in its memory) and the jobs' output is being dropped."""
    try:
        st = os.statvfs(home)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return free if free < config.LOW_DISK_BYTES else None


def _with_top_findings(store: Store, views: list[JobView]) -> list[JobView]:
    """Each run's verdict in short where its shim stored none at its end (a run not over, one whose shim
    died): the current finding that comes first among those the shim recorded live (one query for the
    whole list)."""
    current = store.current_findings((v.job.id, v.run.n) for v in views if not v.run.verdict_rule)
    for i, view in enumerate(views):
        if view.run.verdict_rule:
            continue
        found = current.get((view.job.id, view.run.n))
        if found:
            rule, title = min(found, key=lambda found: root_cause_rank(found[0]))
            views[i] = view._replace(finding=rule, finding_title=title)
    return views

"""jobwarden's jobs as Prometheus metrics: `exposition` is what `/metrics` serves (every live job, and the
jobs ended in the last 24 hours), `job_exposition` what `jobwarden metrics JOB --prometheus` prints.

Names follow Prometheus's conventions: the `jobwarden_` prefix, base units (`_seconds`, `_bytes`,
`_ratio`), `_total` on counters. Series carry `job_id`; the name, a user's free text, rides only on
`jobwarden_job_info` (join: `* on(job_id) group_left(job_name) jobwarden_job_info`). Never a `job` label
(Prometheus renames it: it is the scrape's own), nor pids, command lines, directories or the environment.
Ended jobs leave after a day: a series per job for ever would grow without bound. Everything is read
afresh at each scrape, by the same indexed queries as `ps`.
"""

from __future__ import annotations

import collections
import contextlib
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from jobwarden.control.promtext import Family, render
from jobwarden.control.views.joblist import refresh
from jobwarden.errors import StoreError
from jobwarden.model import ACTIVE_STATES, ENDED_STATES, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pyhooks import read_heartbeat
from jobwarden.store import JobSummary, RunRecord, Store

RECENT_S = 86400.0  # ended jobs are exported this long after their end
PREFIX = "jobwarden_"

# short name (after PREFIX), type, help
_JOB_FAMILIES = (
    ("job_info", "gauge", "Always 1; carries the job's name (join on job_id)."),
    ("job_state", "gauge", "1 for the state of the job's latest run, 0 for the others."),
    ("job_run", "gauge", "The number of the job's latest run (attempt): 1, then 2 after a restart, ..."),
    ("job_restarts_total", "counter", "How many times the job was started again."),
    ("job_start_time_seconds", "gauge", "When the latest run's command started (Unix time)."),
    ("job_end_time_seconds", "gauge", "When the latest run ended (Unix time); absent while it runs."),
    ("job_cpu_seconds_total", "counter", "CPU time of the run's processes; from zero at each run."),
    ("job_memory_rss_bytes", "gauge", "Resident memory of the live run's processes together."),
    ("job_memory_peak_bytes", "gauge", "The most resident memory the run's processes held together."),
    ("job_processes", "gauge", "Processes of the live run."),
    ("job_gpu_memory_bytes", "gauge", "GPU memory held by the live run's processes."),
    ("job_gpu_utilization_ratio", "gauge", "Mean utilisation (0-1) of the GPUs the live run uses."),
    ("job_io_read_bytes_total", "counter", "Bytes the run's processes read; from zero at each run."),
    ("job_io_write_bytes_total", "counter", "Bytes the run's processes wrote; from zero at each run."),
    (
        "job_last_progress_timestamp_seconds",
        "gauge",
        "When the job last wrote output or a heartbeat (Unix time); alert on time() minus this.",
    ),
    ("job_findings", "gauge", "Findings of the latest run still true (hangs, lost workers, ...), by rule."),
    (
        "job_progress_step",
        "gauge",
        "The job's step counter (its progress bar, log or heartbeat); kept at its end.",
    ),
    # a counter by type only: the name is DESIGN.md's, and promtool's lint wants a name ending in _total
    # to be one; the value is the denominator of job_progress_step, fixed for a bar
    ("job_progress_total", "counter", "The step counter's total (the steps the job will have done)."),
    ("job_progress_ratio", "gauge", "The step counter's share of its total (0-1)."),
    ("job_step_rate", "gauge", "Steps per second of the live run, measured by jobwarden's own clock."),
    ("job_eta_seconds", "gauge", "Seconds left for the live run to reach its total at the measured rate."),
    # DESIGN.md "Ranks" names job_name among its labels: a rank's series is read beside its job's own
    ("rank_step_rate", "gauge", "Steps per second of each rank of the live run (its own bar), by rank."),
)
_STORE_FAMILIES = (
    ("findings_total", "counter", "Findings recorded over every run in the store, by rule."),
    ("runs_ended_total", "counter", "Runs in the store that ended, by final state."),
)


def exposition(store: Store, procfs: ProcFS, now: float) -> str:
    """Every job live or ended in the last RECENT_S, and the store's totals. A store that cannot be read
    gives `jobwarden_store_up 0` (and the scrape still succeeds: the exporter itself is up)."""
    started = time.perf_counter()
    try:
        families = _job_families(store, procfs, store.job_list(ended_since=now - RECENT_S))
        families += _store_families(store)
        up = 1
    except (StoreError, sqlite3.Error):
        families, up = [], 0
    families.append(_single("store_up", "1 when the store could be read for this scrape, else 0.", up))
    took = time.perf_counter() - started
    families.append(_single("scrape_duration_seconds", "How long reading the store took.", took))
    return render(families)


def home_exposition(home: Path, procfs: ProcFS, now: float) -> str:
    """`exposition` of the home's store (the web's /metrics)."""
    with Store(home) as store:
        return exposition(store, procfs, now)


def job_exposition(home: Path, procfs: ProcFS, job_ref: str | int, run_n: int | None = None) -> str:
    """One job's series (its run `run_n`, or its latest), whatever the time since it ended."""
    with Store(home) as store:
        job = store.job(job_ref)
        summary = JobSummary(job.id, job.name, job.command, job.created_at)
        return render(_job_families(store, procfs, [(summary, store.run(job.id, run_n))]))


def _job_families(
    store: Store, procfs: ProcFS, listed: Iterable[tuple[JobSummary, RunRecord]]
) -> list[Family]:
    f = {short: Family(PREFIX + short, kind, text) for short, kind, text in _JOB_FAMILIES}
    runs: dict[tuple[int, int], bool] = {}  # (job id, run) -> watched now
    for job, listed_run in listed:
        run = refresh(store, procfs, job, listed_run)
        runs[(job.id, run.n)] = run.state in ACTIVE_STATES
        job_id = str(job.id)
        f["job_info"].add(1, job_id=job_id, job_name=job.name)
        for state in JobState:
            f["job_state"].add(int(run.state == state), job_id=job_id, state=state.value)
        f["job_run"].add(run.n, job_id=job_id)
        f["job_restarts_total"].add(run.n - 1, job_id=job_id)
        _add(f["job_start_time_seconds"], run.started_at, job_id)
        _add(f["job_end_time_seconds"], run.ended_at, job_id)
        _add_resources(f, store, run, job_id)
        _add(f["job_last_progress_timestamp_seconds"], _last_progress(store, job.id, run.n), job_id)
        if run.state == JobState.RUNNING:
            _add_ranks(f["rank_step_rate"], store, run, job_id, job.name)
    for (job_id_n, _), found in sorted(store.current_findings(runs).items()):  # resolved ones are history
        for rule, count in sorted(collections.Counter(rule for rule, _ in found).items()):
            f["job_findings"].add(count, job_id=str(job_id_n), rule=rule)
    _add_progress(f, store, runs)
    return list(f.values())


def _add_progress(f: dict[str, Family], store: Store, runs: dict[tuple[int, int], bool]) -> None:
    """Each run's progress: the counter always (an ended run keeps how far it got), the rate and the
    ETA only while it is watched."""
    for key, p in sorted(store.progress_of_runs(runs).items()):
        job_id = str(key[0])
        _add(f["job_progress_step"], p.step, job_id)
        _add(f["job_progress_total"], p.total, job_id)
        _add(f["job_progress_ratio"], p.fraction, job_id)
        if runs[key]:
            _add(f["job_step_rate"], p.rate, job_id)
            _add(f["job_eta_seconds"], p.eta_s, job_id)


def _add_ranks(family: Family, store: Store, run: RunRecord, job_id: str, job_name: str) -> None:
    """Each rank's own step rate, as its shim last wrote it (store.rankfile)."""
    from jobwarden.store.rankfile import read_ranks

    for row in read_ranks(store.layout.ranks_file(run.job_id, run.n)):
        rate, rank = row.get("rate"), row.get("rank")
        if isinstance(rate, int | float) and isinstance(rank, int):
            family.add(rate, job_id=job_id, job_name=job_name, rank=str(rank))


def _add_resources(f: dict[str, Family], store: Store, run: RunRecord, job_id: str) -> None:
    """From the run's latest sample: counters always, gauges of the moment only while it is watched."""
    sample = store.latest_sample(run.job_id, run.n)
    columns = set(sample.keys()) if sample is not None else set()

    def column(name: str) -> float | None:
        # read by name, and only where the column exists: older and newer stores differ in samples
        return sample[name] if sample is not None and name in columns else None

    _add(f["job_cpu_seconds_total"], column("cpu_time_s"), job_id)
    _add(f["job_io_read_bytes_total"], column("io_read_bytes"), job_id)
    _add(f["job_io_write_bytes_total"], column("io_write_bytes"), job_id)
    peak = run.mem_peak_bytes if run.mem_peak_bytes is not None else store.peak_rss(run.job_id, run.n)
    _add(f["job_memory_peak_bytes"], peak, job_id)
    if run.state not in ACTIVE_STATES:
        return
    _add(f["job_memory_rss_bytes"], column("rss_bytes"), job_id)
    _add(f["job_processes"], column("nprocs"), job_id)
    _add(f["job_gpu_memory_bytes"], column("gpu_memory_bytes"), job_id)
    util = column("gpu_util")  # percent, as NVML gives it
    _add(f["job_gpu_utilization_ratio"], None if util is None else util / 100.0, job_id)


def _last_progress(store: Store, job_id: int, run: int) -> float | None:
    """The later of the output's last write and the heartbeat: what the hang watchdog watches first."""
    seen = []
    with contextlib.suppress(OSError):
        seen.append(store.layout.output_log(job_id, run).stat().st_mtime)
    beat = read_heartbeat(store.layout.heartbeat_file(job_id, run))
    if beat is not None:
        seen.append(beat.at)
    return max(seen, default=None)


def _store_families(store: Store) -> list[Family]:
    f = {short: Family(PREFIX + short, kind, text) for short, kind, text in _STORE_FAMILIES}
    for rule, count in store.finding_counts().items():
        f["findings_total"].add(count, rule=rule)
    ended = store.run_state_counts(ENDED_STATES)
    for state in sorted(ENDED_STATES):
        f["runs_ended_total"].add(ended.get(state, 0), state=state.value)
    return list(f.values())


def _single(short: str, text: str, value: float) -> Family:
    family = Family(PREFIX + short, "gauge", text)
    family.add(value)
    return family


def _add(family: Family, value: float | None, job_id: str) -> None:
    if value is not None:  # unknown is left out, never reported as 0
        family.add(value, job_id=job_id)

"""One job as every frontend sees it: `status`, `explain`, the web's job page and `top`'s detail pane all
read this view, and render or serialise it; none of them assembles a job from the store itself.

The JSON of `status --json` and `explain --json` is a contract (docs/architecture.md): the web API serves the
same dictionaries, so a field added here appears in every frontend at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from jobwarden.clock import SystemClock, iso, shown_span
from jobwarden.control.views.joblist import live_processes, refresh
from jobwarden.model import Finding, JobState, ProcessSnapshot, Ranks
from jobwarden.osapi.procfs import ProcFS
from jobwarden.progress.model import Progress
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.records import Event
from jobwarden.verdict.explainer import findings_for

_NO_RANKS = Ranks(None)


class Attempt(NamedTuple):
    """One run of a job, as the attempts timeline shows it."""

    n: int
    state: str
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: str | None
    end_reason: str | None
    progress: Progress | None = None  # how far it got: where the next attempt resumed from

    def to_json(self) -> dict[str, Any]:
        p = self.progress
        return {
            "n": self.n,
            "state": self.state,
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "end_reason": self.end_reason,
            "first_step": p.first_step if p else None,
            "step": p.step if p else None,
            "total": p.total if p else None,
        }


class JobStatus(NamedTuple):
    """A run of a job as it is now: its record refreshed (a dead shim makes it `lost`), the processes alive
    now, the verdict root cause first, its events and every attempt of the job."""

    job: JobRecord
    run: RunRecord
    processes: list[ProcessSnapshot]
    findings: list[Finding]
    events: list[Event]
    attempts: list[Attempt]
    log_path: Path
    progress: Progress | None = None  # the run's latest progress (progress.model), null when it showed none
    peak_rss_bytes: int | None = None  # the most memory the run's processes held together
    ranks: list[dict[str, Any]] = []  # noqa: RUF012 - each rank of a running job (store.rankfile)

    @property
    def restarts(self) -> int:
        """How many times the job was started again after its first run (up to the run shown)."""
        return max(0, self.run.n - 1)

    @property
    def runs_under(self) -> dict[str, Any]:
        """Its limits and policies as in force, secrets left out (control.views.runsunder)."""
        from jobwarden.control.views.runsunder import runs_under

        return runs_under(self.job, self.run, self.restarts)

    @property
    def previous_progress(self) -> Progress | None:
        """How far the attempt before this one got (a restarted run resumes from somewhere)."""
        return next((a.progress for a in self.attempts if a.n == self.run.n - 1), None)

    @property
    def hung(self) -> bool:
        """Running, and its root cause now is a hang (model.HUNG_RULES): `hung` wherever its state is
        shown, as `ps` shows it, never `running` in one place and `hung` in another."""
        from jobwarden.model import HUNG_RULES
        from jobwarden.rules.speed import SPEED_RULES

        cause = next((f.rule for f in self.current_findings if f.rule not in SPEED_RULES), None)
        return self.run.state == JobState.RUNNING and cause in HUNG_RULES

    @property
    def current_findings(self) -> list[Finding]:
        """What is true now (for an ended run: at its end), root cause first."""
        return [f for f in self.findings if f.current]

    @property
    def resolved_findings(self) -> list[Finding]:
        """What was true for a while and stopped being so (a hang that ended, a process continued)."""
        return [f for f in self.findings if not f.current]

    @property
    def recovery(self) -> str | None:
        """'hung 14:02–14:19, then recovered; succeeded': a run all of whose findings stopped being true,
        told instead of a root cause. None when something is still wrong, or nothing ever was."""
        if self.current_findings or not self.resolved_findings:
            return None
        ended = self.resolved_findings
        spans = ", ".join(f"{_what(f.rule)} {shown_span(f.at, f.resolved_at)}" for f in ended)
        return f"{spans}, then recovered; {self.run.state}"

    @property
    def verdict(self) -> str | None:
        """The run in one line: its root cause's title, how it recovered, or None."""
        current = self.current_findings
        return current[0].title if current else self.recovery

    @property
    def disk_full_paths(self) -> list[str]:
        """Files the shim could not write because the disk was full (output may have been lost)."""
        return [str(e.data.get("path")) for e in self.events if e.kind == "disk-full"]

    @property
    def group_errors(self) -> list[str]:
        """Why a --group run's shared records were not written (its group directory is unwritable)."""
        return [str(e.data.get("error")) for e in self.events if e.kind == "group-unwritable"]

    @property
    def log_dropped(self) -> dict[str, Any] | None:
        """--log-max: the output range dropped to keep the log within its cap (the latest trim), or why
        the file system could not drop any; None when nothing was dropped."""
        for e in reversed(self.events):
            if e.kind == "log-trimmed":
                d = e.data
                return {
                    "start": d.get("start"),
                    "end": d.get("end"),
                    "bytes": d.get("dropped_bytes"),
                    "max_bytes": d.get("max_bytes"),
                    "unsupported": None,
                }
            if e.kind == "log-trim-unsupported":
                return {
                    "start": None,
                    "end": None,
                    "bytes": 0,
                    "max_bytes": e.data.get("max_bytes"),
                    "unsupported": e.data.get("error"),
                }
        return None

    @property
    def notify_failures(self) -> list[dict[str, Any]]:
        """Notifications that could not be delivered (a removed Slack webhook answers 404)."""
        keys = ("event", "target", "detail")
        return [
            {"at": iso(e.at), **{k: e.data.get(k) for k in keys}}
            for e in self.events
            if e.kind == "notify-failed"
        ]

    def to_json(self) -> dict[str, Any]:
        """`status --json`. Never the job's environment: `job.env` holds `--env` values (tokens)."""
        job, run = self.job, self.run
        return {
            "id": job.id,
            "name": job.name,
            "state": str(run.state),
            "hung": self.hung,  # as in `ps --json`: running, and its root cause now is a hang
            "run": run.n,
            "pid": run.pid,
            "exit_code": run.exit_code,
            "signal": run.signal,
            "started_at": iso(run.started_at),
            "ended_at": iso(run.ended_at),
            "end_reason": run.end_reason,
            "error": run.error,
            "command": list(job.command),
            "cwd": job.cwd,
            "rerun_of": job.rerun_of,
            "shim_pid": run.shim_pid,
            "containment": run.containment,
            "queued_reason": run.queued_reason,
            "gpu_ids": list(run.gpu_ids),
            "log": str(self.log_path),
            "processes": [_process_json(p) for p in self.processes],
            "orphans_left": run.orphans_left,
            "survivors": [s._asdict() for s in run.survivors],
            "findings": [f.to_json() for f in self.findings],
            "runs": [a.to_json() for a in self.attempts],
            "log_dropped": self.log_dropped,
            "kept": [dict(k) for k in run.kept],
            "notify_failures": self.notify_failures,
            "progress": self._progress_json(),
            "runs_under": self.runs_under,
            "elapsed_s": _elapsed(self.run),
            "peak_rss_bytes": self.peak_rss_bytes,
            "restarts": self.restarts,
            "ranks": [_rank_json(r) for r in self.ranks],
        }

    def _progress_json(self) -> dict[str, Any] | None:
        return self.progress.to_json(SystemClock().wall()) if self.progress else None

    def explain_json(self) -> dict[str, Any]:
        """`explain --json`: the verdict, most likely root cause first."""
        run = self.run
        return {
            "id": self.job.id,
            "run": run.n,
            "state": str(run.state),
            "hung": self.hung,
            "exit_code": run.exit_code,
            "signal": run.signal,
            "verdict": self.verdict,
            "findings": [f.to_json() for f in self.findings],
            "progress": self._progress_json(),
        }


# what a finding that ended was, in a word: "hung 14:02–14:19"
_WHAT = {
    "no-progress": "hung",
    "fork-deadlock": "hung (fork deadlock)",
    "collective-hang": "hung in a collective",
    "uninterruptible-io": "stuck in D state",
    "process-stopped": "stopped",
    "gpu-idle": "GPU idle",
}


def _elapsed(run: RunRecord) -> float | None:
    from jobwarden.control.views.runsunder import elapsed_s

    value = elapsed_s(run, SystemClock().wall())
    return None if value is None else round(value, 3)


def _what(rule: str) -> str:
    return _WHAT.get(rule, rule)


def _process_json(p: ProcessSnapshot) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "ppid": p.ppid,
        "cmdline": p.cmdline,
        "state": p.state,
        "rss_bytes": p.rss_bytes,
        "cpu_percent": p.cpu_percent,
        "gpu_memory_bytes": p.gpu_memory_bytes,
        **(p.ranks or _NO_RANKS).to_json(),
    }


_RANK_KEYS = (
    "rank",
    "local_rank",
    "node",
    "pid",
    "step",
    "rate",
    "where",
    "where_detail",
    "gpu",
    "collective",
)


def _rank_json(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in _RANK_KEYS}


def _ranks(store: Store, run: RunRecord) -> list[dict[str, Any]]:
    """Where each rank is now, as its shim last wrote it; none once the run has ended (a rank that is
    no more is nowhere)."""
    if run.state != JobState.RUNNING:
        return []
    from jobwarden.store.rankfile import read_ranks

    return read_ranks(store.layout.ranks_file(run.job_id, run.n))


def status_of(home: Path, procfs: ProcFS, job_ref: str | int, run_n: int | None = None) -> JobStatus:
    """`job_status` read from the home's store (`status`, the web's status)."""
    with Store(home) as store:
        return job_status(store, procfs, job_ref, run_n)


def job_status(store: Store, procfs: ProcFS, job_ref: str | int, run_n: int | None = None) -> JobStatus:
    """The view of run `run_n` (default: the latest) of a job named by id or name."""
    job = store.job(job_ref)
    run = refresh(store, procfs, job, store.run(job.id, run_n))
    runs = store.runs(job.id)
    reached = store.progress_of_runs((job.id, r.n) for r in runs)
    events = store.events(job.id, run.n)
    return JobStatus(
        job=job,
        run=run,
        processes=live_processes(store, procfs, job, run),
        findings=findings_for(store, job, run),
        events=events,
        attempts=[_attempt(r, reached.get((job.id, r.n))) for r in runs],
        log_path=store.layout.output_log(job.id, run.n),
        progress=store.progress(job.id, run.n),
        peak_rss_bytes=_peak(store, run, events),
        ranks=_ranks(store, run),
    )


def _peak(store: Store, run: RunRecord, events: list[Event]) -> int | None:
    """The most memory the run held: its samples' peak, or the cgroup's at an OOM kill (a spike between two
    samples: `status` must not say 10M where `explain` says the job hit its 64M limit)."""
    sampled = run.mem_peak_bytes if run.mem_peak_bytes is not None else store.peak_rss(run.job_id, run.n)
    seen = [v for e in events if e.kind == "oom" and isinstance(v := e.data.get("peak_bytes"), int)]
    peaks = [p for p in (sampled, *seen) if p is not None]
    return max(peaks) if peaks else None


def _attempt(run: RunRecord, progress: Progress | None) -> Attempt:
    return Attempt(
        run.n,
        str(run.state),
        run.started_at,
        run.ended_at,
        run.exit_code,
        run.signal,
        run.end_reason,
        progress,
    )

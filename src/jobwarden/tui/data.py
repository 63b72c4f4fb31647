"""What `top` shows, read in one pass: the job list and the selected job's whole view.

The app calls these from a worker thread, so a slow disk or a busy store never freezes the screen. Each
reads through control (control.views.top reads the store in one pass and closes it before returning plain
data: no cursor or transaction outlives a refresh)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from jobwarden.clock import SystemClock
from jobwarden.control.views.joblist import JobView
from jobwarden.control.views.joblog import output_log, tail_lines
from jobwarden.control.views.jobstatus import JobStatus
from jobwarden.control.views.metrics import Sample
from jobwarden.control.views.metrics import sparkline as metrics_sparkline
from jobwarden.control.views.top import top_read
from jobwarden.osapi.procfs import ProcFS
from jobwarden.text.sanitize import last_frame, terminal_text

SPARK_WINDOW_S = 600.0  # the detail pane's CPU and RSS history: the last ten minutes
SPARK_POINTS = 60
LOG_TAIL_LINES = 200  # the detail pane's tail; the full-screen log view reads more


class JobRow(NamedTuple):
    view: JobView
    gpu_memory_bytes: int | None


class Detail(NamedTuple):
    status: JobStatus
    log_tail: list[str]
    cpu_percent: list[float]  # oldest first; empty when no samples (or no sampling support)
    rss_bytes: list[float]
    latest_cpu_percent: float | None  # as the job list shows them
    latest_rss_bytes: int | None
    step_rate: tuple[float, ...] = ()  # steps per second over the same minutes, where it shows progress
    loss: tuple[float, ...] = ()  # the loss it reports, where it does


class Snapshot(NamedTuple):
    rows: list[JobRow]
    detail: Detail | None  # of the selected job (the first one when none is selected)


def load(home: Path, procfs: ProcFS, include_ended: bool, selected: int | None) -> Snapshot:
    now = SystemClock().wall()
    read = top_read(home, procfs, include_ended, selected, now, SPARK_WINDOW_S, SPARK_POINTS)
    rows = [JobRow(v, gpu) for v, gpu in zip(read.views, read.gpu_memory, strict=True)]
    if read.selected is None or read.status is None:
        return Snapshot(rows, None)
    return Snapshot(rows, _detail(read.status, read.samples, read.selected))


def load_status(home: Path, procfs: ProcFS, job_id: int) -> JobStatus:
    """The job as its explain key shows it: a failure cites what changed since its last success."""
    from jobwarden.control.changes import explained

    return explained(home, procfs, job_id)


def read_job_log(home: Path, job_id: int, run: int, lines: int) -> list[str]:
    return read_log(output_log(home, job_id, run), lines)


def read_log(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a log, decoded as the job wrote them (bad bytes replaced), each as a
    terminal shows it: its last frame (a progress bar redrawn with carriage returns), no escapes."""
    decoded = (b.decode("utf-8", "replace").rstrip("\r\n") for b in tail_lines(path, lines))
    return [terminal_text(last_frame(line)) for line in decoded]


def _detail(status: JobStatus, samples: list[Sample], view: JobView) -> Detail:
    cpu = [s.cpu_percent for s in samples if s.cpu_percent is not None]
    rss = [float(s.rss_bytes) for s in samples if s.rss_bytes is not None]
    tail = read_log(status.log_path, LOG_TAIL_LINES)
    rates = tuple(s.step_rate for s in samples if s.step_rate is not None)
    loss_key = status.progress.loss_name if status.progress else None
    loss = tuple(v for s in samples if (v := dict(s.metrics).get(loss_key or "")) is not None)
    return Detail(status, tail, cpu, rss, view.cpu_percent, view.rss_bytes, rates, loss)


def sparkline(values: Sequence[float], width: int) -> str:
    return metrics_sparkline(values, width) if values else ""

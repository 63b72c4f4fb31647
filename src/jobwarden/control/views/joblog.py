"""A run's output log as the frontends read it: where it is, and the readers of store.logfiles (the
shim's writer stays there). A frontend reads a log through here, never through the store itself."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from jobwarden.store import RunRecord, Store
from jobwarden.store.logfiles import (
    follow,
    iter_output,
    line_start,
    output_length,
    read_from,
    read_new,
    read_piece,
    since_offset,
    stream_from,
    tail_lines,
)

__all__ = [
    "RunLog",
    "follow",
    "iter_output",
    "line_start",
    "output_length",
    "output_log",
    "read_from",
    "read_new",
    "read_piece",
    "run_log",
    "since_offset",
    "stream_from",
    "tail_lines",
]


class RunLog(NamedTuple):
    job_id: int
    name: str
    run: RunRecord
    path: Path  # the output, as the job wrote it
    index_file: Path  # wall time -> offset, for --since


def run_log(home: Path, ref: str | int, run_n: int | None) -> RunLog:
    """Run `run_n` of the job `ref` names (its latest by default): its record and its log's files."""
    with Store(home) as store:
        job = store.job(ref)
        run = store.run(job.id, run_n)
        log, index = store.layout.output_log(job.id, run.n), store.layout.output_index(job.id, run.n)
        return RunLog(job.id, job.name, run, log, index)


def output_log(home: Path, job_id: int, run: int) -> Path:
    """Where run `run` of job `job_id` writes its output (whether or not it exists)."""
    with Store(home) as store:
        return store.layout.output_log(job_id, run)

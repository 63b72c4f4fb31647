"""What `run` and `rerun` say of the job they started, and waiting for a job's end: `run -f`/`-w`,
`rerun -f`/`-w`, `wait`, and an attached run; the exit status is the job's (or --requeue-exit's)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobwarden.cli.common import open_procfs, print_json

if TYPE_CHECKING:
    from jobwarden.control.jobs import RunRecord


def launched_said(
    launched: Any, as_json: bool, follow: bool, wait: bool, extra: dict[str, Any] | None = None
) -> int:
    """What `run` and `rerun` say of the job they started, then follow or wait for it if asked."""
    if launched.namesakes:
        warn_namesakes(launched.name, launched.namesakes)
    if as_json:
        print_json({**launched.to_json(), **(extra or {})})
    elif not follow:
        print(launched.id)  # alone on stdout: JOB=$(jobwarden run ...)
        if sys.stderr is not None and sys.stderr.isatty():  # None: started with fd 2 closed (2>&-)
            _said_start(launched, f"jobwarden logs -f {launched.id} follows it")
    if follow:
        _said_start(launched, "following its output; Ctrl-C stops following, never the job")
        return follow_output(str(launched.id), None, True)
    if wait:
        return wait_exit(str(launched.id), said=True)
    return 0


def _said_start(launched: Any, then: str) -> None:
    """'jobwarden: job 4 (train) started, pid 1234: ...' on stderr: which job, by id and name, at once."""
    from jobwarden.text.sanitize import one_line

    if sys.stderr is None:
        return
    state = launched.state if launched.pid is None else f"started, pid {launched.pid}"
    print(f"jobwarden: job {launched.id} ({one_line(launched.name)}) {state}: {then}", file=sys.stderr)


def warn_namesakes(name: str, older: Sequence[int]) -> None:
    """A name that older jobs, still not over, hold too: from now on it means the newest."""
    if older:
        ids = ", ".join(str(i) for i in older)
        print(
            f"jobwarden: note: {name!r} also names job{'s' if len(older) > 1 else ''} {ids}, not over yet; "
            f"{name!r} now means the newest, reach the older by id",
            file=sys.stderr,
        )


def follow_output(job_ref: str, run_n: int | None, exit_with_status: bool) -> int:
    """`run -f`: the output as it comes, the restarts' runs too; at the end, how the job ended, and its
    status as ours."""
    from jobwarden.cli.joboutput import JobOutput, LaterRuns, follow_runs, source_of
    from jobwarden.control.lifecycle import wait_job
    from jobwarden.paths import home_dir

    procfs = open_procfs()
    source = source_of(home_dir(), job_ref, run_n)
    out = JobOutput()
    try:
        follow_runs(source, 0, procfs, LaterRuns(home_dir(), pinned=run_n is not None), out)
        out.close()
    except KeyboardInterrupt:
        print(f"\njobwarden: stopped following; job {source.job_id} keeps running", file=sys.stderr)
        return 130
    if not exit_with_status:
        return 0
    ended = wait_job(home_dir(), procfs, str(source.job_id))
    return said_end(source.name, ended)


def wait_exit(job_ref: str, timeout: float | None = None, as_json: bool = False, said: bool = False) -> int:
    """Wait for the job's end and exit with its status (128+N for signal N); `said`: with the line that
    says how it ended. Still running at `timeout`: 124, as timeout(1)."""
    from jobwarden.control.lifecycle import StillRunning, wait_job
    from jobwarden.model import JobState
    from jobwarden.paths import home_dir

    try:
        run = wait_job(home_dir(), open_procfs(), job_ref, timeout)
    except StillRunning as still:
        if as_json:
            print_json(
                {
                    "id": still.run.job_id,
                    "run": still.run.n,
                    "state": str(still.run.state),
                    "exit_code": None,
                    "signal": None,
                }
            )
        print(f"jobwarden: {still.message}", file=sys.stderr)
        return still.exit_code
    if as_json:
        print_json(
            {
                "id": run.job_id,
                "run": run.n,
                "state": str(run.state),
                "exit_code": run.exit_code,
                "signal": run.signal,
            }
        )
    if said:
        from jobwarden.control.jobs import find_job

        return said_end(find_job(home_dir(), run.job_id).name, run)
    if run.state == JobState.LOST:
        print(
            f"jobwarden: job {run.job_id} is lost: its supervisor died, its exit status is unknown",
            file=sys.stderr,
        )
    return requeue_or(run, run.exit_status)


def said_end(name: str, run: RunRecord) -> int:
    from jobwarden.text.ending import end_line

    print(end_line(name, run), file=sys.stderr)
    return requeue_or(run, run.exit_status)


def requeue_or(run: RunRecord, status: int) -> int:
    """--requeue-exit's code when the run's end is retryable (control.requeue), else its own status."""
    from jobwarden.control.requeue import requeue_code
    from jobwarden.paths import home_dir

    code = requeue_code(home_dir(), run)
    if code is not None:
        print(
            f"jobwarden: job {run.job_id} ended retryably: exit {code} asks the engine to requeue it",
            file=sys.stderr,
        )
        return code
    return status

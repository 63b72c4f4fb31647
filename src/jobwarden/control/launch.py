"""`jobwarden run`: check the command, record the job, start its shim, return once the pid is known."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from jobwarden import trace
from jobwarden.clock import SystemClock
from jobwarden.errors import (
    CommandNotExecutable,
    CommandNotFound,
    Interrupted,
    JobwardenError,
    ShimExited,
    UsageError,
)
from jobwarden.joboptions import JobOptions
from jobwarden.model import EndReason, JobSpec, JobState
from jobwarden.osapi.process import which
from jobwarden.store import Store

_INTERPRETERS = {"python", "python3", "bash", "sh", "zsh", "node", "ruby", "perl", "uv", "torchrun"}


class Launched(NamedTuple):
    id: int
    name: str
    run: int
    pid: int | None
    state: str
    shim_pid: int
    exit_code: int | None = None
    error: str | None = None
    namesakes: tuple[int, ...] = ()  # older jobs of the same name, not over yet: the name now means this one

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "pid": self.pid, "state": self.state}


def resolve_command(argv: list[str], cwd: str, env: dict[str, str]) -> str:
    """Fail at once, before anything is recorded or started, for a command that cannot run."""
    if not argv:
        raise UsageError("no command given", "put it after --, e.g. jobwarden run -- python train.py")
    program = argv[0]
    if "/" in program:
        path = Path(cwd, program)
        if not path.exists():
            raise CommandNotFound(f"command not found: {program}", f"no such file (relative to {cwd})")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise CommandNotExecutable(
                f"not executable: {program}", f"chmod +x {program}, or run it through its interpreter"
            )
        return str(path)
    found = which(program, env.get("PATH", os.defpath))
    if found is None:
        raise CommandNotFound(
            f"command not found: {program}",
            "check the spelling and PATH "
            "(jobwarden runs it without a shell; use sh -c '...' for shell syntax)",
        )
    return found


MAX_NAME = 128  # characters of a job's name


def checked_name(name: str) -> str:
    """--name: printable (a newline or an escape byte would forge lines and colours in every listing), not
    all digits (`stop 2` must mean job 2, never a job named "2"), not starting with '@' (`@last`), and at
    most MAX_NAME characters (every listing shows it whole; a queue's name is capped the same way)."""
    if len(name) > MAX_NAME:
        raise UsageError(
            f"--name {name[:20]!r}...: {len(name)} characters, longer than the {MAX_NAME} a name may have",
            "give a shorter --name",
        )
    if not name or not name.isprintable():
        raise UsageError(f"--name {name!r}: a name must be printable text", "e.g. --name train-lr3")
    if name.isdecimal():
        raise UsageError(f"--name {name!r}: a name of digits would read as a job id", "e.g. --name run{name}")
    if name.startswith("@"):  # `@last` and any such word to come name jobs by position, never by name
        raise UsageError(
            f"--name {name!r}: a name must not start with '@'", f"e.g. --name {name[1:] or 'train'}"
        )
    return name


def default_name(argv: list[str]) -> str:
    """`python train.py --lr 3` -> 'train.py'; `./run.sh` -> 'run.sh'. Unprintable characters become
    '?', and a name of digits or one starting with '@' gets a prefix (see checked_name)."""
    name = _name_from(argv)
    name = "".join(c if c.isprintable() else "?" for c in name[: MAX_NAME - len("job-")]) or "job"
    return f"job-{name}" if name.isdecimal() or name.startswith("@") else name


def _name_from(argv: list[str]) -> str:
    first = os.path.basename(argv[0])
    if first.rstrip("0123456789.") in _INTERPRETERS:
        args = iter(argv[1:])
        for arg in args:
            if arg == "-c":
                break
            if arg == "-m":
                return next(args, first)[:40]
            if not arg.startswith("-"):
                return os.path.basename(arg)[:40] or first
    return first[:40]


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"bad --env {pair.split('=')[0]!r}", "use --env KEY=VALUE")
        env[key] = value
    return env


def _interrupted(store: Store, job_id: int, run: int, state: JobState, handed_over: bool) -> Interrupted:
    """Ctrl-C while the shim starts the job. Handed over, the job starts anyway: say which it is, so it
    can be found and stopped. Not handed over, nothing will start it: record that now, never a ghost
    `starting` job that reads "supervisor killed" later."""
    if handed_over:
        return Interrupted(
            f"interrupted; job {job_id} was handed to its supervisor and runs on",
            f"jobwarden status {job_id}; jobwarden stop {job_id} to end it",
        )
    _record_unstarted(store, job_id, run, state, "interrupted (Ctrl-C) before it started")
    return Interrupted(f"interrupted; job {job_id} was not started")


def _record_unstarted(store: Store, job_id: int, run: int, state: JobState, error: str) -> None:
    """starting -> failed: nothing will run it, so say so now, not once the run is found `lost`."""
    now = SystemClock().wall()
    if store.update_run(
        job_id,
        run,
        only_if_state=(state,),
        state=JobState.FAILED,
        end_reason=EndReason.SUPERVISOR_FAILED,
        ended_at=now,
        error=error,
    ):
        store.add_event(job_id, run, "supervisor-failed", now, error=error)


def _shim_died(store: Store, job_id: int, run: int, shim_pid: int) -> None:
    """The shim ended without a word. If the job runs anyway (it killed its shim as it started), that
    is what is recorded and said: never "not started" over a live job."""
    from jobwarden.control.views.joblist import lost_at_start
    from jobwarden.osapi.procfs import ProcFS

    pid = lost_at_start(store, ProcFS(), store.job(job_id), run)
    if pid is not None:
        raise JobwardenError(
            f"the supervisor of job {job_id} (pid {shim_pid}) died as the job started: job {job_id} runs "
            f"on unsupervised as pid {pid}, lost",
            f"jobwarden adopt {job_id} to supervise it again; jobwarden stop {job_id} to end it",
        )


def _forget_refused(home: Path, job_id: int, shim_pid: int) -> None:
    """A start the shim refused (a GPU request this machine cannot meet): once the shim is gone (it
    writes nothing after its answer, and exits), the job is removed, so no failed job is left in the
    lists for a command that never ran."""
    import shutil

    from jobwarden.errors import ProcessGone
    from jobwarden.osapi import pidfd
    from jobwarden.osapi.waiting import wait_readable

    try:
        fd = pidfd.open_pidfd(shim_pid)
    except ProcessGone:
        fd = -1
    if fd >= 0:
        try:
            wait_readable([fd], 10.0)
        finally:
            pidfd.close(fd)
    with Store(home) as store:
        store.delete_job(job_id)
        shutil.rmtree(store.layout.job_dir(job_id), ignore_errors=True)


def launch(home: Path, spec: JobSpec, options: JobOptions, rerun_of: int | None = None) -> Launched:
    from jobwarden.control.shimproc import fork_shim

    cwd = os.path.abspath(spec.cwd)
    if not os.path.isdir(cwd):
        raise UsageError(f"--cwd {spec.cwd}: no such directory")
    resolve_command(list(spec.command), cwd, {**os.environ, **spec.env})
    spec = spec._replace(cwd=cwd)
    # the shim first: it gets ready while the job is recorded (see control.shimproc)
    # inside an engine the shim stays our child: `run` is the engine's task until the job ends
    with fork_shim(home, "launch", attached=options.engine is not None) as shim, Store(home) as store:
        # a job that asks for GPUs or waits its turn (--after, --queue) is `queued` until it may start
        state = JobState.QUEUED if options.wants_gpus or options.after or options.queue else JobState.STARTING
        created: tuple[int, int] | None = None  # one name, so that a Ctrl-C finds it whole or not at all
        try:
            created = store.create_job(spec, options.to_json(), SystemClock().wall(), state, rerun_of)
            trace.info(f"job {created[0]} recorded ({state}); handing it to supervisor pid {shim.pid}")
            report = shim.start(*created)
        except KeyboardInterrupt:
            if created is None:
                raise  # nothing was recorded (create_job removes a job it could not finish)
            raise _interrupted(store, *created, state, shim.handed_over) from None
        except ShimExited as err:
            assert created is not None  # only start() raises it
            _shim_died(store, *created, shim.pid)
            _record_unstarted(store, *created, state, err.message)
            raise
        job_id, run = created
        namesakes = tuple(store.unfinished_namesakes(spec.name, job_id))
    shim_pid = shim.pid
    trace.info(f"supervisor {shim_pid} reported: {report}")
    if report.get("refused"):  # it can never start here: no trace of it is kept, as if never asked
        _forget_refused(home, job_id, shim_pid)
        raise UsageError(
            f"cannot start it: {report['error']}", "run it without --gpus/--gpu-ids, or elsewhere"
        )
    if "error" in report:
        code = int(report.get("exit_code", 1))
        error_cls = CommandNotFound if code == 127 else CommandNotExecutable if code == 126 else UsageError
        raise error_cls(f"job {job_id} could not start: {report['error']}")
    state = report.get("state", "running")
    return Launched(job_id, spec.name, run, report.get("pid"), state, shim_pid, namesakes=namesakes)

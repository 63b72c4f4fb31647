"""One handler per subcommand: turn arguments into a control call and print what it returns.

Each handler imports what it alone needs: `run` starts every job, and its latency is a goal."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden import config
from jobwarden.clock import SystemClock
from jobwarden.errors import UsageError
from jobwarden.model import JobSpec, JobState
from jobwarden.paths import home_dir

if TYPE_CHECKING:
    from jobwarden.control.jobstatus import JobStatus
    from jobwarden.joboptions import JobOptions
    from jobwarden.store import RunRecord


def _home() -> Path:
    return home_dir()


def _procfs() -> Any:
    from jobwarden.osapi.procfs import ProcFS

    return ProcFS()


def _print_lines(lines: Iterable[str]) -> None:
    from jobwarden.text.term import for_terminal  # the edge: no byte of a job's reaches the terminal raw

    for line in for_terminal(lines):
        print(line)


def _print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2))


def cmd_run(args: argparse.Namespace) -> int:
    from jobwarden.control.launch import checked_name, default_name, launch, parse_env
    from jobwarden.control.options import engine_options, run_options

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UsageError("no command given", "put it after --, e.g. jobwarden run -- python train.py")
    from jobwarden.paths import config_file

    web_url = None
    if os.path.lexists(config_file()):  # without a config file, one stat and nothing more loaded
        from jobwarden.control.configfile import RUN_KEYS, run_defaults

        values, web_url = run_defaults({key for key in RUN_KEYS if getattr(args, key, None) is not None})
        for key, value in values.items():  # a flag given overrides the file
            setattr(args, key, value)
    options = run_options(
        timeout=args.timeout,
        grace=args.grace,
        hang_timeout=args.hang_timeout,
        on_hang=args.on_hang or "dump",
        py_hooks=not args.no_py_hooks,
        mp_start=args.mp_start,
        restart=args.restart,
        max_restarts=args.max_restarts,
        restart_delay=args.restart_delay,
        mem_limit=args.mem_limit,
        gpus=args.gpus,
        gpu_ids=args.gpu_ids,
        notify=args.notify,
        on_event=args.on_event,
        log_max=args.log_max,
        keep_running=args.keep_running,
        queue=args.queue,
        after=_after(args.after),
        web_url=web_url,
        engine=engine_options(
            os.environ,
            engine=args.engine,
            detach=args.detach,
            group=args.group,
            group_dir=args.group_dir,
            rank=args.rank,
            node=args.node,
            requeue_exit=args.requeue_exit,
            max_requeues=args.max_requeues,
        ),
    )
    env = parse_env(args.env)
    name = checked_name(args.name) if args.name is not None else default_name(argv)
    spec = JobSpec(command=tuple(argv), cwd=args.cwd, name=name, env=env)
    if options.wants_gpus:
        from jobwarden.control.gpurequest import refuse_impossible_gpus

        refuse_impossible_gpus(options)
    if options.engine is not None:
        if args.json:
            raise UsageError(
                f"run --json inside {options.engine}: attached, run's stdout carries the job's output",
                "drop --json (jobwarden status --json JOB gives the record), or add --detach",
            )
        return _run_attached(spec, options, _termination_log(args.termination_log))
    if args.termination_log is not None:
        raise UsageError(
            "--termination-log: only an attached run writes its verdict at the end",
            "run it as a container's entrypoint, inside Slurm or Ray, or with --engine container",
        )
    launched = launch(_home(), spec, options)
    return launched_said(launched, args.json, args.follow, args.wait)


def _after(refs: list[str] | None) -> list[int] | None:
    if not refs:
        return None
    from jobwarden.cli.everyday import job_ids

    return job_ids(_home(), refs)


def launched_said(
    launched: Any, as_json: bool, follow: bool, wait: bool, extra: dict[str, Any] | None = None
) -> int:
    """What `run` and `rerun` say of the job they started, then follow or wait for it if asked."""
    if launched.namesakes:
        from jobwarden.cli.everyday import warn_namesakes

        warn_namesakes(launched.name, launched.namesakes)
    if as_json:
        _print_json({**launched.to_json(), **(extra or {})})
    elif not follow:
        print(launched.id)  # alone on stdout: JOB=$(jobwarden run ...)
        if sys.stderr is not None and sys.stderr.isatty():  # None: started with fd 2 closed (2>&-)
            _said_start(launched, f"jobwarden logs -f {launched.id} follows it")
    if follow:
        _said_start(launched, "following its output; Ctrl-C stops following, never the job")
        return _follow(str(launched.id), None, True)
    if wait:
        return _wait_exit(str(launched.id), said=True)
    return 0


def _said_start(launched: Any, then: str) -> None:
    """'jobwarden: job 4 (train) started, pid 1234: ...' on stderr: which job, by id and name, at once."""
    from jobwarden.text.sanitize import one_line

    if sys.stderr is None:
        return
    state = launched.state if launched.pid is None else f"started, pid {launched.pid}"
    print(f"jobwarden: job {launched.id} ({one_line(launched.name)}) {state}: {then}", file=sys.stderr)


def _termination_log(path: str | None) -> str | None:
    from jobwarden.control.termination import checked_path

    return checked_path(path) if path is not None else None


def _run_attached(spec: JobSpec, options: JobOptions, termination_log: str | None) -> int:
    """Inside an engine: the CLI stays its task, relays its signals to the shim, copies the job's output
    to stdout and exits with the job's status (control.attached). In a container, or with
    --termination-log, the verdict goes where the platform shows it (_tell_the_end)."""
    from jobwarden.control.attached import SignalRelay, engine_budget_s, follow_attached
    from jobwarden.control.launch import launch

    relay = SignalRelay()
    relay.install()  # from here on the engine's signals are the job's, never the death of this process
    if options.engine == "ray":
        # Ray's job supervisor can die without signalling its entrypoint (its actor killed or crashed):
        # Ray then kills the entrypoint's shell, our parent, and the run must end with it, not run on
        from jobwarden.osapi.process import die_with_parent

        die_with_parent(os.getppid())
    if options.engine_budget_s is None:
        options = options._replace(engine_budget_s=engine_budget_s(options.engine, os.environ))
    launched = launch(_home(), spec, options)
    relay.attach(launched.shim_pid)
    follow_attached(_home(), launched.id, launched.run, launched.shim_pid)
    from jobwarden.store import Store

    with Store(_home()) as store:
        run = store.run(launched.id)  # the last attempt: one shim runs them all
    if run.state.is_ended:
        status = run.exit_status
        status = status if options.requeue_exit is None else _requeue_or(run, status)
    else:
        status = _wait_exit(str(launched.id))  # its shim died before it recorded the end: found `lost` there
    if options.engine == "container" or termination_log is not None:
        _tell_the_end(launched.id, status, termination_log, to_stderr=options.engine == "container")
    return status


def _tell_the_end(job_id: int, status: int, termination_log: str | None, to_stderr: bool) -> None:
    """The verdict as the last lines of stderr (`docker logs`) and in the termination message
    (`kubectl describe pod`): a failure to tell it never changes the exit status."""
    from jobwarden.control.termination import run_verdict, write_termination_log
    from jobwarden.errors import JobwardenError
    from jobwarden.text.verdict import fit, verdict_lines

    try:
        job, run, findings = run_verdict(_home(), job_id)
    except JobwardenError as err:
        print(f"jobwarden: cannot tell how job {job_id} ended: {err.message}", file=sys.stderr)
        return
    lines = verdict_lines(job.id, job.name, run, findings, status)
    if to_stderr:
        sys.stdout.flush()  # the job's output first, then the verdict
        _print_lines_to(sys.stderr, lines)
    problem = write_termination_log(fit(lines), termination_log)
    if problem is not None:
        print(f"jobwarden: {problem}", file=sys.stderr)


def _print_lines_to(stream: Any, lines: Iterable[str]) -> None:
    for line in lines:
        print(line, file=stream)


def _follow(job_ref: str, run_n: int | None, exit_with_status: bool) -> int:
    """`run -f`: the output as it comes, the restarts' runs too; at the end, how the job ended, and its
    status as ours."""
    from jobwarden.cli.logscmd import JobOutput, LaterRuns, follow_runs, source_of
    from jobwarden.control.lifecycle import wait_job

    procfs = _procfs()
    source = source_of(_home(), job_ref, run_n)
    out = JobOutput()
    try:
        follow_runs(source, 0, procfs, LaterRuns(_home(), pinned=run_n is not None), out)
        out.close()
    except KeyboardInterrupt:
        print(f"\njobwarden: stopped following; job {source.job_id} keeps running", file=sys.stderr)
        return 130
    if not exit_with_status:
        return 0
    ended = wait_job(_home(), procfs, str(source.job_id))
    return _said_end(source.name, ended)


def _wait_exit(job_ref: str, timeout: float | None = None, as_json: bool = False, said: bool = False) -> int:
    """Wait for the job's end and exit with its status (128+N for signal N); `said`: with the line that
    says how it ended. Still running at `timeout`: 124, as timeout(1)."""
    from jobwarden.control.lifecycle import StillRunning, wait_job
    from jobwarden.store import Store

    try:
        run = wait_job(_home(), _procfs(), job_ref, timeout)
    except StillRunning as still:
        if as_json:
            _print_json(
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
        _print_json(
            {
                "id": run.job_id,
                "run": run.n,
                "state": str(run.state),
                "exit_code": run.exit_code,
                "signal": run.signal,
            }
        )
    if said:
        with Store(_home()) as store:
            return _said_end(store.job(run.job_id).name, run)
    if run.state == JobState.LOST:
        print(
            f"jobwarden: job {run.job_id} is lost: its supervisor died, its exit status is unknown",
            file=sys.stderr,
        )
    return _requeue_or(run, run.exit_status)


def _said_end(name: str, run: RunRecord) -> int:
    from jobwarden.text.ending import end_line

    print(end_line(name, run), file=sys.stderr)
    return _requeue_or(run, run.exit_status)


def _requeue_or(run: RunRecord, status: int) -> int:
    """--requeue-exit's code when the run's end is retryable (control.requeue), else its own status."""
    from jobwarden.control.requeue import requeue_code

    code = requeue_code(_home(), run)
    if code is not None:
        print(
            f"jobwarden: job {run.job_id} ended retryably: exit {code} asks the engine to requeue it",
            file=sys.stderr,
        )
        return code
    return status


def cmd_health(args: argparse.Namespace) -> int:
    from jobwarden.control.health import health

    verdict = health(_home(), args.job)
    if args.json:
        _print_json(verdict.to_json())
    else:
        job = f"job {verdict.job_id}: " if verdict.job_id is not None else ""
        _print_lines([f"{verdict.status}: {job}{verdict.reason}"])  # a reason may quote a job's reference
    return verdict.exit_code


def cmd_wait(args: argparse.Namespace) -> int:
    """Exit codes: the job's status (128+N for signal N), 124 when it still runs at --timeout (as
    timeout(1)), 125 when there is no such job (timeout(1)'s code for a failure of its own)."""
    from jobwarden.errors import JobNotFound

    timeout = config.optional_duration(args.timeout, "--timeout")
    try:
        return _wait_exit(args.job, timeout, args.json, said=not args.json)
    except JobNotFound as err:
        print(f"jobwarden: {err.message}", file=sys.stderr)
        print(f"  {err.remedy}", file=sys.stderr)
        return WAIT_NO_SUCH_JOB


WAIT_NO_SUCH_JOB = 125


def cmd_ps(args: argparse.Namespace) -> int:
    import gc

    from jobwarden.text import render

    # A list of 10,000 jobs is some 100,000 small objects made at once, which the cycle collector would
    # walk again and again (~15 % of `ps --all`); this process makes no cycles worth collecting, and exits.
    gc.disable()
    from jobwarden.control.views import home_disk_full, job_views
    from jobwarden.store import Store

    last = None if args.last is None else config.parse_count(args.last, "--last")
    if last == 0:
        raise UsageError("bad --last '0': must be 1 or more", "e.g. jobwarden ps --all --last 50")
    states = None if args.state is None else config.parse_states(args.state)
    since = None if args.since is None else config.parse_duration(args.since, "--since")
    filtered = states is not None or args.name is not None
    # an ended state asked for needs the ended jobs; a filter pages after filtering, not before
    include_ended = args.all or bool(states and states - _UNFINISHED_WORDS)
    with Store(_home()) as store:
        views = job_views(
            store,
            _procfs(),
            include_ended=include_ended,
            limit=None if filtered else last,
            metrics=args.json,
            ended_since=None if since is None or include_ended else SystemClock().wall() - since,
        )
        full = home_disk_full(store)
    if filtered or (since is not None and include_ended):
        from jobwarden.control.views import filtered_views

        ended_since = None if since is None else SystemClock().wall() - since
        views = filtered_views(views, states, args.name, ended_since)
        views = views[-last:] if last is not None else views
    if full is not None:
        print(
            f"jobwarden: WARNING: the disk holding {_home()} is full ({full} bytes free): no job's end or "
            "finding can be recorded, and output written now is lost",
            file=sys.stderr,
        )
    if args.json:
        _print_json([v.summary_json() for v in views])
    else:
        # into a pipe or a file, whole lines: `ps | grep` must find what a terminal would cut; unless
        # COLUMNS says a width, as procps' ps does
        width = None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 0
        _print_lines(render.ps_table(views, SystemClock().wall(), wide=args.wide, width=width))
    return 0


_UNFINISHED_WORDS = frozenset({"queued", "starting", "running", "hung", "stopping", "restarting", "lost"})


def _job_status(job_ref: str, run_n: int | None) -> JobStatus:
    from jobwarden.control.jobstatus import job_status
    from jobwarden.store import Store

    with Store(_home()) as store:
        return job_status(store, _procfs(), job_ref, run_n)


def cmd_status(args: argparse.Namespace) -> int:
    from jobwarden.store.repo import LAST_JOB
    from jobwarden.text import render

    status = _job_status(args.job or LAST_JOB, args.run)
    if args.job is None:
        from jobwarden.cli.logscmd import say_newest

        say_newest("status", status.job.id, status.job.name)
    if args.json:
        _print_json(status.to_json())
    else:
        _print_lines(render.status_report(status, SystemClock().wall()))
        from jobwarden.cli.metricscmd import status_sparklines

        _print_lines(status_sparklines(_home(), status))
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from jobwarden.cli.metricscmd import metrics

    return metrics(_home(), args)


def cmd_explain(args: argparse.Namespace) -> int:
    from jobwarden.text import render

    if args.group is not None:
        return _explain_group(args)
    for example, name in _GROUP_ONLY.items():
        if getattr(args, name) not in (None, False):
            flag = example.split()[0]
            raise UsageError(
                f"explain {flag} goes with --group ID", f"e.g. jobwarden explain --group ID {example}"
            )
    if args.job is None:
        raise UsageError("explain needs a JOB (an id or a name), or --group ID")
    from jobwarden.control.changes import explained
    from jobwarden.store import Store

    with Store(_home()) as store:
        status = explained(store, _procfs(), args.job, args.run)
    profiled = _newest_profile(status.job.id, status.run.n)
    if args.json:
        _print_json({**status.explain_json(), "profile": profiled})
    else:
        _print_lines(render.explain_report(status, SystemClock().wall()))
        if profiled is not None:  # what the job was doing when last profiled (on a speed finding too)
            from jobwarden.text.profile import profile_line

            _print_lines(["", profile_line(profiled)])
    return 0


def _newest_profile(job_id: int, run: int) -> dict[str, Any] | None:
    from jobwarden.control.profile import newest_summary
    from jobwarden.store import Store

    with Store(_home()) as store:
        return newest_summary(store, job_id, run)


_GROUP_ONLY = {  # explain's flags of a group's verdict, as the user types them: the Namespace's names
    "--attempt 1": "attempt",
    "--exit-status": "exit_status",
    "--group-dir DIR": "group_dir",
    "--clock-tolerance 2s": "clock_tolerance",
}


def _explain_group(args: argparse.Namespace) -> int:
    from jobwarden.control.groupview import SETTLE_S, group_view
    from jobwarden.control.options import group_directory, group_id
    from jobwarden.text.group import group_report

    if args.job is not None:
        raise UsageError(
            "explain: give a JOB or --group ID, not both", "e.g. jobwarden explain --group exp-7"
        )
    if args.run is not None:
        raise UsageError("explain --run goes with a JOB, not --group", "e.g. jobwarden explain --group ID")
    if args.attempt is not None and args.attempt < 0:
        raise UsageError(f"bad --attempt {args.attempt}: an attempt is 0 or more", "e.g. --attempt 1")
    group_id(args.group)
    args.group_dir = group_directory(args.group_dir)
    tolerance = config.optional_duration(args.clock_tolerance, "--clock-tolerance")
    # --exit-status is asked once the job is over (after srun, in the batch script): a rank with no end
    # then is lost, once the shared file system has had a moment to show every node's last lines
    settle = SETTLE_S if args.exit_status else 0.0
    view = group_view(_home(), args.group, args.attempt, args.group_dir, tolerance, args.exit_status, settle)
    if args.json:
        _print_json(view.to_json())
    else:
        _print_lines(group_report(view))
    return view.exit_status() if args.exit_status else 0


def cmd_logs(args: argparse.Namespace) -> int:
    from jobwarden.cli.logscmd import logs

    return logs(_home(), _procfs(), args)


def cmd_stop(args: argparse.Namespace) -> int:
    from jobwarden.control.lifecycle import stop
    from jobwarden.text import render

    if args.job is None:
        raise UsageError("stop needs a JOB: it never guesses which job to end", _running_jobs_hint())
    if args.force and args.grace is not None:
        raise UsageError("--force and --grace exclude each other", "--force is --grace 0: SIGKILL now")
    grace = 0.0 if args.force else config.optional_duration(args.grace, "--grace")
    result = stop(_home(), _procfs(), args.job, grace)
    if args.json:
        _print_json(result.to_json())
    else:
        _print_lines(render.stop_report(result))
    return 1 if result.survivors else 0


def _running_jobs_hint() -> str:
    from jobwarden.control.views import job_views
    from jobwarden.store import Store
    from jobwarden.text.sanitize import terminal_text

    with Store(_home()) as store:
        views = job_views(store, _procfs(), include_ended=False)
    if not views:
        return "no job is running now"
    named = ", ".join(f"{v.job.id} ({terminal_text(v.job.name)})" for v in views[-8:])
    more = f" and {len(views) - 8} more (jobwarden ps)" if len(views) > 8 else ""
    return f"running: {named}{more}; e.g. jobwarden stop {views[-1].job.id}"


def cmd_adopt(args: argparse.Namespace) -> int:
    from jobwarden.control.lifecycle import adopt

    report = adopt(_home(), _procfs(), args.job)
    if args.json:
        _print_json(report)
    elif report.get("restarted"):  # its supervisor had died in a restart's backoff: the restart is made
        how = f"started run {report['run']} (pid {report['pid']})" if report.get("pid") else "queued run"
        _print_lines([f"adopted job {args.job}: {how}, the restart its supervisor died waiting to make"])
    else:
        pids = [str(p) for p in report.get("pids", [])]  # type: ignore[attr-defined]
        _print_lines([f"adopted job {args.job}: watching {len(pids)} process(es): {' '.join(pids)}"])
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    from jobwarden.control.dump import DEFAULT_TIMEOUT_S, dump_job
    from jobwarden.text import render

    timeout = config.optional_duration(args.timeout, "--timeout")
    result = dump_job(
        _home(),
        _procfs(),
        args.job,
        native=not args.no_native,
        timeout_s=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
    )
    if args.json:
        if not result.live:
            print(f"jobwarden: {render.dump_heading(result)}", file=sys.stderr)
        _print_json(result.to_json())
    else:
        _print_lines(render.dump_report(result))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from jobwarden.control.profile import parse_profile_duration, parse_rate, profile_job
    from jobwarden.text.profile import profile_report

    duration = parse_profile_duration(args.duration)
    rate = parse_rate(args.rate)
    result = profile_job(
        _home(), _procfs(), args.job, duration_s=duration, rate_hz=rate, run_n=args.run, trigger=args.trigger
    )
    if args.json:
        _print_json(result.to_json())
    else:
        _print_lines(profile_report(result.summary, str(result.path) if result.path else None))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from jobwarden.control.lifecycle import remove

    if args.ended:
        from jobwarden.cli.everyday import rm_ended

        return rm_ended(_home(), _procfs(), args)
    for flag, given in (("--failed", args.failed), ("--older-than", args.older_than is not None)):
        if given:
            raise UsageError(f"rm {flag} goes with --ended", f"e.g. jobwarden rm --ended {flag} ...")
    if args.job is None:
        raise UsageError(
            "rm needs a JOB, or --ended", "e.g. jobwarden rm 3, or jobwarden rm --ended --older-than 7d"
        )
    job_id = remove(_home(), _procfs(), args.job)
    print(f"removed job {job_id}")
    return 0


def cmd_orphans(args: argparse.Namespace) -> int:
    from jobwarden.control.orphans import find_strays, release_dead_cgroups
    from jobwarden.store import Store
    from jobwarden.text import render

    procfs, now = _procfs(), SystemClock().wall()
    grace = config.optional_duration(args.grace, "--grace")
    with Store(_home()) as store:
        strays = find_strays(store, procfs, now)
    release_dead_cgroups()
    listed = [s.to_json(now) for s in strays]
    if not args.kill:
        if args.json:
            _print_json(listed)
        else:
            _print_lines(render.orphans_table(listed))
        return 0
    from jobwarden.control.killer import end_strays, outcomes_json

    results = end_strays(procfs, strays, grace if grace is not None else config.DEFAULT_GRACE_S)
    outcomes = outcomes_json(listed, results)
    if args.json:
        _print_json(outcomes)
    else:
        _print_lines(render.kill_report(outcomes))
    return 0 if all(r.ended for r in results) else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from jobwarden.control.doctor import report_json, run_checks
    from jobwarden.control.hostfacts import gather
    from jobwarden.text import render

    report = report_json(run_checks(gather(_home())))
    if args.json:
        _print_json(report)
    else:
        _print_lines(render.doctor_report(report))
    return 0 if report["ok"] else 1


def cmd_completion(args: argparse.Namespace) -> int:
    from jobwarden.cli.completion import script
    from jobwarden.cli.main import build_parser

    sys.stdout.write(script(args.shell, build_parser()))
    return 0


def cmd_jobs_to_complete(args: argparse.Namespace) -> int:
    from jobwarden.store import Store

    with Store(_home()) as store:  # one a line: a name that is not printable (an old store's) is left out
        _print_lines(r for pair in store.job_refs() for ref in pair if (r := str(ref)).isprintable())
    return 0


def cmd_runs_to_complete(args: argparse.Namespace) -> int:
    from jobwarden.cli.completion import run_numbers

    for n in run_numbers(args.words):
        print(n)
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from jobwarden.tui.command import top  # textual and rich load here, never on other commands' path

    return top(_home(), args.interval, args.all, args.read_only)


def cmd_web(args: argparse.Namespace) -> int:
    from jobwarden.web.command import web  # uvicorn and asyncio: only for this command

    socket_path = Path(args.socket).absolute() if args.socket else None
    return web(_home(), args.host, args.port, socket_path, args.read_only, args.allow_host)


# --- everyday habits (issue 21): in cli.everyday, loaded by these commands alone ----------------------


def cmd_rerun(args: argparse.Namespace) -> int:
    from jobwarden.cli.everyday import rerun

    return rerun(args)


def cmd_queue(args: argparse.Namespace) -> int:
    from jobwarden.cli.everyday import queue

    return queue(args)


def cmd_resume(args: argparse.Namespace) -> int:
    from jobwarden.cli.everyday import resume

    return resume(args)


def cmd_boot(args: argparse.Namespace) -> int:
    from jobwarden.cli.everyday import boot

    return boot(args)


def cmd_diff(args: argparse.Namespace) -> int:
    from jobwarden.cli.diffcmd import diff

    return diff(_home(), args)


def note_namesakes(args: argparse.Namespace) -> None:
    """A JOB given by a name (never an id or @last: those cost nothing) that older live jobs share."""
    ref = getattr(args, "job", None)
    if isinstance(ref, list):  # `logs -f 3 5 7`
        for one in ref:
            note_namesakes(argparse.Namespace(**{**vars(args), "job": one}))
        return
    if (
        not isinstance(ref, str)
        or not ref
        or ref.isdigit()
        or ref.startswith("@")
        or args.command.startswith("_")
    ):
        return
    from jobwarden.cli.everyday import note_namesakes as note

    note(_home(), ref)


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "ps": cmd_ps,
    "status": cmd_status,
    "logs": cmd_logs,
    "stop": cmd_stop,
    "wait": cmd_wait,
    "adopt": cmd_adopt,
    "explain": cmd_explain,
    "dump": cmd_dump,
    "metrics": cmd_metrics,
    "profile": cmd_profile,
    "rm": cmd_rm,
    "orphans": cmd_orphans,
    "doctor": cmd_doctor,
    "health": cmd_health,
    "completion": cmd_completion,
    "_jobs": cmd_jobs_to_complete,
    "_runs": cmd_runs_to_complete,
    "top": cmd_top,
    "web": cmd_web,
    "rerun": cmd_rerun,
    "queue": cmd_queue,
    "resume": cmd_resume,
    "boot": cmd_boot,
    "diff": cmd_diff,
}

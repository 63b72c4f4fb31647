"""`jobwarden run -- CMD`: start a job (detached, or attached inside an engine) and print its id.

It sits on the latency budget of every job start: this module imports at its top only what parsing
needs, and each step imports what it alone needs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from jobwarden import config
from jobwarden.cli.launched import launched_said, requeue_or, wait_exit
from jobwarden.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from jobwarden.joboptions import JobOptions
    from jobwarden.model import JobSpec

HELP = "start a job (detached) and print its id"


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--name", help="a name to refer to the job by (default: from the command)")
    run.add_argument("--cwd", default=".", help="working directory of the job")
    run.add_argument("--env", action="append", default=[], metavar="K=V", help="set an environment variable")
    run.add_argument("--timeout", metavar="DUR", help="stop the job after this long (e.g. 12h)")
    run.add_argument(
        "--grace", metavar="DUR", help="SIGTERM -> SIGKILL delay when ending the job (default 10s)"
    )
    run.add_argument(
        "--hang-timeout",
        metavar="DUR|off",
        help="hung after this long with no output, heartbeat, CPU, I/O or GPU work (default 10m)",
    )
    run.add_argument(
        "--on-hang",
        choices=("dump", "stop", "restart"),
        help="on a hang: store the stacks and keep the job (dump, default), end it, or restart it",
    )
    run.add_argument(
        "--no-py-hooks",
        action="store_true",
        default=None,  # None: not given, so the config file's no_py_hooks may say
        help="do not load jobwarden's hooks into Python processes",
    )
    run.add_argument(
        "--mp-start",
        choices=("spawn", "forkserver"),
        help="force this multiprocessing start method in the job (the cure for fork deadlocks)",
    )
    run.add_argument(
        "--mem-limit",
        metavar="SIZE",
        help="end the job when its processes together use more memory (e.g. 8G), as the OOM killer would",
    )
    run.add_argument(
        "--restart",
        metavar="no|on-failure|always",
        help="start the job again when it ends (never after `jobwarden stop`; default no)",
    )
    run.add_argument(
        "--max-restarts",
        metavar="N|unlimited",
        help=f"restart at most N times (default {config.DEFAULT_MAX_RESTARTS}; unlimited: a service, kept up "
        "whatever the failure, the backoff still applies); alone, means on-failure",
    )
    run.add_argument(
        "--restart-delay",
        metavar="DUR",
        help="the first restart's backoff, doubled for each quick failure after it up to 5m, back to the "
        "start after a run of 10m or more (default 1s)",
    )
    run.add_argument(
        "--gpus", metavar="N", help="wait for N free GPUs and run on them (sets CUDA_VISIBLE_DEVICES)"
    )
    run.add_argument(
        "--gpu-ids", metavar="I,J", help="wait for exactly these GPUs (indexes as nvidia-smi shows them)"
    )
    run.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="stream the output (Ctrl-C stops following, never the job)",
    )
    run.add_argument(
        "-w",
        "--wait",
        action="store_true",
        help="wait for the end; exit with the job's status (128+N for signal N)",
    )
    run.add_argument(
        "--notify",
        metavar="URL",
        help="POST each event (failed, hung, recovered, restarted, succeeded) as JSON to this http(s) URL",
    )
    run.add_argument(
        "--on-event",
        metavar="CMD",
        help="run CMD through /bin/sh on each event, with the event as JSON on its stdin",
    )
    _habit_arguments(run)
    _engine_arguments(run)
    run.add_argument("--json", action="store_true", help="print the job as JSON: id, name, pid, state")
    run.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]", help="the command to run, after --"
    )


# --- everyday habits (issue 21): run's options of their own ----------------------------------------


def _habit_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--py-hooks",
        dest="no_py_hooks",
        action="store_false",
        help="load the hooks even where the config file says no_py_hooks = true",
    )
    run.add_argument(
        "--log-max",
        metavar="SIZE|off",
        help="keep output.log within SIZE on disk: its head and newest tail, the middle dropped and said "
        f"(default {config.format_size(config.DEFAULT_LOG_MAX_BYTES)})",
    )
    run.add_argument(
        "--keep-running",
        action="append",
        metavar="PATTERN",
        help="leave running at the job's end the processes whose command line matches this regular "
        "expression (a TensorBoard); `jobwarden stop JOB` ends them; repeatable",
    )
    sweep = run.add_argument_group("sweeps")
    sweep.add_argument(
        "--after",
        action="append",
        metavar="JOB",
        help="start once JOB has succeeded (queued until then); if JOB fails, this one is cancelled; "
        "repeatable",
    )
    sweep.add_argument(
        "--queue",
        metavar="NAME",
        help="wait for a place in queue NAME (`jobwarden queue NAME --parallel N`, default 1 at a time)",
    )


def _engine_arguments(run: argparse.ArgumentParser) -> None:
    engine = run.add_argument_group("inside an engine (Slurm, Ray, a container)")
    engine.add_argument(
        "--engine",
        default="auto",
        metavar="auto|slurm|ray|container|none",
        help="run attached as the engine's task: forward its signals, exit with the job's status "
        "(default auto: Slurm and Ray are found by their variables, a container when run is its main "
        "process)",
    )
    engine.add_argument("--detach", action="store_true", help="inside an engine, detach as on its own")
    engine.add_argument("--group", metavar="ID", help="the distributed job this run is a part of")
    engine.add_argument("--group-dir", metavar="DIR", help="shared directory of the group's records")
    engine.add_argument("--rank", metavar="N", help="this run's rank (default: SLURM_PROCID)")
    engine.add_argument(
        "--node", metavar="NAME", help="the node as the engine names it (default: SLURMD_NODENAME)"
    )
    engine.add_argument(
        "--requeue-exit", metavar="CODE", help="exit with CODE (144-255) when the cause is retryable"
    )
    engine.add_argument("--max-requeues", metavar="N", help="no requeue code from attempt N on")
    engine.add_argument(
        "--termination-log",
        metavar="PATH",
        help="attached: write the verdict (at most 4 KiB) here at the end (default: /dev/termination-log "
        "when Kubernetes mounted it)",
    )


def handle(args: argparse.Namespace) -> int:
    from jobwarden.control.launch import checked_name, default_name, launch, parse_env
    from jobwarden.control.options import engine_options, run_options
    from jobwarden.model import JobSpec

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UsageError("no command given", "put it after --, e.g. jobwarden run -- python train.py")
    from jobwarden.paths import config_file, home_dir

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
    launched = launch(home_dir(), spec, options)
    return launched_said(launched, args.json, args.follow, args.wait)


def _after(refs: list[str] | None) -> list[int] | None:
    from jobwarden.paths import home_dir

    if not refs:
        return None
    return _job_ids(home_dir(), refs)


def _job_ids(home: Path, refs: list[str]) -> list[int]:
    """--after JOB...: each reference resolved now (a name or @last means the job it names now)."""
    from jobwarden.control.jobs import job_ids

    return job_ids(home, refs)


def _termination_log(path: str | None) -> str | None:
    from jobwarden.control.termination import checked_path

    return checked_path(path) if path is not None else None


def _run_attached(spec: JobSpec, options: JobOptions, termination_log: str | None) -> int:
    """Inside an engine: the CLI stays its task, relays its signals to the shim, copies the job's output
    to stdout and exits with the job's status (control.attached). In a container, or with
    --termination-log, the verdict goes where the platform shows it (_tell_the_end)."""
    from jobwarden.control.attached import SignalRelay, engine_budget_s, follow_attached
    from jobwarden.control.launch import launch
    from jobwarden.paths import home_dir

    relay = SignalRelay()
    relay.install()  # from here on the engine's signals are the job's, never the death of this process
    if options.engine == "ray":
        # Ray's job supervisor can die without signalling its entrypoint (its actor killed or crashed):
        # Ray then kills the entrypoint's shell, our parent, and the run must end with it, not run on
        from jobwarden.osapi.process import die_with_parent

        die_with_parent(os.getppid())
    if options.engine_budget_s is None:
        options = options._replace(engine_budget_s=engine_budget_s(options.engine, os.environ))
    launched = launch(home_dir(), spec, options)
    relay.attach(launched.shim_pid)
    follow_attached(home_dir(), launched.id, launched.run, launched.shim_pid)
    from jobwarden.control.jobs import stored_run

    run = stored_run(home_dir(), launched.id)  # the last attempt: one shim runs them all
    if run.state.is_ended:
        status = run.exit_status
        status = status if options.requeue_exit is None else requeue_or(run, status)
    else:
        status = wait_exit(str(launched.id))  # its shim died before it recorded the end: found `lost` there
    if options.engine == "container" or termination_log is not None:
        _tell_the_end(launched.id, status, termination_log, to_stderr=options.engine == "container")
    return status


def _tell_the_end(job_id: int, status: int, termination_log: str | None, to_stderr: bool) -> None:
    """The verdict as the last lines of stderr (`docker logs`) and in the termination message
    (`kubectl describe pod`): a failure to tell it never changes the exit status."""
    from jobwarden.control.termination import run_verdict, write_termination_log
    from jobwarden.errors import JobwardenError
    from jobwarden.paths import home_dir
    from jobwarden.text.verdict import fit, verdict_lines

    try:
        job, run, findings = run_verdict(home_dir(), job_id)
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

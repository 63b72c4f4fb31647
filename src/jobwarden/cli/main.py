"""Argument parsing and the one error funnel. Each subcommand has one handler in `handlers`.

`run` sits on the latency budget of every job start, so this module imports only what parsing needs:
nothing for -v but `trace`, and for a known subcommand only that subcommand's parser is built (argparse
looks up translations for every help string, a few stat calls each, which adds up over ten parsers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from jobwarden import __version__, config, trace
from jobwarden.errors import JobwardenError
from jobwarden.text.term import terminal_width

if TYPE_CHECKING:
    from typing import Any


class _HelpFormatter(argparse.HelpFormatter):
    """argparse makes a formatter for every argument it adds (to check its metavar), and the default one
    imports shutil (~10 ms with the compression modules it pulls in) only to ask for the terminal width."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or terminal_width() - 2)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a mistyped command is answered with the nearest command, and never
    with the list of every choice (which names the hidden commands a completion uses)."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if isinstance(action, argparse._SubParsersAction) and value not in (action.choices or ()):
            raise _UnknownCommand(str(value))  # not an ArgumentError: argparse would print its usage
        super()._check_value(action, value)


class _UnknownCommand(Exception):
    def __init__(self, word: str) -> None:
        super().__init__(word)
        self.word = word


def public_commands() -> list[str]:
    return [name for name in _SUBCOMMANDS if not name.startswith("_")]


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """'; did you mean X?' for the candidate nearest `word`, or '' when none is near."""
    from difflib import get_close_matches

    near = get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI; with `only` (a subcommand name), a parser that knows just that subcommand."""
    p = _Parser(
        prog="jobwarden",
        description="Run long jobs detached, contained, and never silently dead.",
        epilog="environment: JOBWARDEN_HOME is where jobs are kept (default ~/.local/state/jobwarden); "
        "JOBWARDEN_UTC=1 shows times in UTC; NO_COLOR=1 turns colours off. Defaults for run: "
        "~/.config/jobwarden/config.toml (jobwarden doctor shows the one in force).",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"jobwarden {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    p.add_argument(
        "--utc",
        action="store_true",
        help="show every time in UTC (default: local time with its offset; or set JOBWARDEN_UTC=1)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments) in _SUBCOMMANDS.items():
        if only is None or only == name:
            if help_text:
                parser = sub.add_parser(name, help=help_text, formatter_class=_HelpFormatter)
            else:  # no help: left out of the command list
                parser = sub.add_parser(name, formatter_class=_HelpFormatter)
            add_arguments(parser)
            if not name.startswith("_"):  # `jobwarden status 3 --utc` as well as `jobwarden --utc status 3`
                parser.add_argument(
                    "--utc", action="store_true", default=argparse.SUPPRESS, help="show times in UTC"
                )
    return p


def _run_arguments(run: argparse.ArgumentParser) -> None:
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


# --- everyday habits (issue 21): run's options and commands of their own -----------------------------


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


def _rerun_arguments(rerun: argparse.ArgumentParser) -> None:
    rerun.add_argument("job", metavar="JOB", help="the job to run again: an id, a name or @last")
    rerun.add_argument("-f", "--follow", action="store_true", help="stream the output, then exit as it did")
    rerun.add_argument(
        "-w", "--wait", action="store_true", help="wait for the end; exit with the job's status"
    )
    rerun.add_argument("--json", action="store_true", help="print the new job as JSON, with rerun_of")


def _rm_arguments(rm: argparse.ArgumentParser) -> None:
    rm.add_argument("job", metavar="JOB", nargs="?", help="the job to remove (or use --ended)")
    rm.add_argument(
        "--ended", action="store_true", help="remove every ended job (succeeded, failed, stopped)"
    )
    rm.add_argument("--failed", action="store_true", help="with --ended: only the failed ones")
    rm.add_argument(
        "--older-than", metavar="DUR", help="with --ended: only those that ended more than DUR ago (e.g. 7d)"
    )
    rm.add_argument(
        "-y", "--yes", action="store_true", help="do not ask for confirmation (needed without a terminal)"
    )


def _queue_arguments(queue: argparse.ArgumentParser) -> None:
    queue.add_argument("name", metavar="NAME", nargs="?", help="the queue (default: list every queue)")
    queue.add_argument("--parallel", metavar="N", help="let N runs of the queue run at once")
    queue.add_argument("--json", action="store_true", help="the queues as JSON")


def _resume_arguments(resume: argparse.ArgumentParser) -> None:
    resume.add_argument("--json", action="store_true", help="what was marked and started, as JSON")


def _boot_arguments(boot: argparse.ArgumentParser) -> None:
    boot.add_argument("action", choices=("enable", "disable", "status"), help="enable, disable or status")
    boot.add_argument(
        "--method",
        choices=("auto", "systemd", "cron"),
        default="auto",
        help="a systemd user unit, or a cron @reboot line (default auto: systemd where it runs)",
    )
    boot.add_argument("--json", action="store_true", help="what was written, as JSON")


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


def _explain_arguments(explain: argparse.ArgumentParser) -> None:
    explain.add_argument("job", metavar="JOB", nargs="?", help="an id, a name (its newest job) or @last")
    explain.add_argument("--run", type=int, metavar="N", help="an earlier attempt (default: the last)")
    explain.add_argument("--group", metavar="ID", help="one verdict for every rank of a distributed job")
    explain.add_argument("--attempt", type=int, metavar="K", help="with --group: that attempt (default last)")
    explain.add_argument(
        "--exit-status",
        action="store_true",
        help="with --group: exit 0 if it succeeded, the requeue code if the cause is retryable, else 1",
    )
    explain.add_argument("--group-dir", metavar="DIR", help="with --group: where the ranks wrote the records")
    explain.add_argument(
        "--clock-tolerance",
        metavar="DUR",
        help="with --group: clocks closer than this tie (default 2s)",
    )
    explain.add_argument("--json", action="store_true", help="the findings as JSON, root cause first")


def _ps_arguments(ps: argparse.ArgumentParser) -> None:
    ps.add_argument("-a", "--all", action="store_true", help="include ended jobs")
    ps.add_argument("--last", metavar="N", help="only the N newest of the jobs listed")
    ps.add_argument(
        "-w",
        "--wide",
        action="store_true",
        help="a VERDICT column (each finding's title) and whole commands, never cut to the terminal",
    )
    ps.add_argument(
        "--state",
        metavar="STATE[,STATE]",
        help="only jobs in these states (queued, starting, running, hung, stopping, restarting, succeeded, "
        "failed, stopped, lost); ended states need no --all",
    )
    ps.add_argument(
        "--name", metavar="PATTERN", help="only jobs whose name matches (shell wildcards: 'lr-*')"
    )
    ps.add_argument(
        "--since",
        metavar="DUR",
        help="only jobs not over, or that ended in the last DUR (e.g. 2h: what the last 2 hours saw)",
    )
    ps.add_argument("--json", action="store_true", help="the jobs as a JSON list")


def _status_arguments(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "job", metavar="JOB", nargs="?", help="an id, a name (its newest job) or @last (the default)"
    )
    status.add_argument("--run", type=int, metavar="N", help="an earlier attempt (default: the last)")
    status.add_argument("--json", action="store_true", help="the whole record as JSON")


def _logs_arguments(logs: argparse.ArgumentParser) -> None:
    logs.add_argument(
        "job",
        metavar="JOB",
        nargs="*",
        help="an id, a name (its newest job) or @last (the default); several: their lines interleaved, each "
        "prefixed",
    )
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print the last 10 lines (see -n), then what the job writes until it ends, its restarts too",
    )
    logs.add_argument(
        "-n", "--lines", metavar="N|all", help="only the last N lines (default: all; with -f, 10)"
    )
    logs.add_argument("--since", metavar="DUR", help="only output written in the last DUR (e.g. 10m)")
    logs.add_argument("--run", type=int, metavar="N", help="an earlier attempt (with -f: that run only)")
    logs.add_argument(
        "--raw",
        action="store_true",
        help="into a pipe, every byte as written (default: a line redrawn with \\r as its last frame, as "
        "a terminal shows it; a terminal always gets the output sanitised)",
    )


def _stop_arguments(stop: argparse.ArgumentParser) -> None:
    stop.add_argument(
        "job", metavar="JOB", nargs="?", help="an id, a name (its newest job) or @last; never guessed"
    )
    stop.add_argument("--grace", metavar="DUR", help="SIGTERM -> SIGKILL delay (default: the job's, 10s)")
    stop.add_argument(
        "--force", action="store_true", help="SIGKILL what is left now; cuts short a stop already waiting"
    )
    stop.add_argument("--json", action="store_true", help="how it ended and what survived, as JSON")


def _wait_arguments(wait: argparse.ArgumentParser) -> None:
    wait.add_argument("job", metavar="JOB", help="an id, a name or @last")
    wait.add_argument(
        "--timeout",
        metavar="DUR",
        help="give up after DUR: exit 124 if the job still runs (as timeout(1))",
    )
    wait.add_argument("--json", action="store_true", help="print how it ended as JSON")


def _job_and_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    parser.add_argument("--json", action="store_true", help="the answer as JSON")


def _dump_arguments(dump: argparse.ArgumentParser) -> None:
    dump.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    dump.add_argument(
        "--no-native", action="store_true", help="Python frames only: each process is paused for less time"
    )
    dump.add_argument("--timeout", metavar="DUR", help="the most the whole capture may take (default 5s)")
    dump.add_argument("--json", action="store_true", help="the stacks as JSON")


def _profile_arguments(profile: argparse.ArgumentParser) -> None:
    profile.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    profile.add_argument("--duration", metavar="DUR", help="how long to sample (default 10s, at most 5m)")
    profile.add_argument(
        "--rate", metavar="HZ", help="samples per second (default: chosen from the job's thread count)"
    )
    profile.add_argument("--run", type=int, metavar="N", help=argparse.SUPPRESS)
    profile.add_argument("--trigger", choices=("cli", "auto"), default="cli", help=argparse.SUPPRESS)
    profile.add_argument("--json", action="store_true", help="the profile's summary and top list as JSON")


def _completion_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", metavar="SHELL", help="bash, zsh or fish")


def _orphans_arguments(orphans: argparse.ArgumentParser) -> None:
    orphans.add_argument("--kill", action="store_true", help="end them (SIGTERM, grace, SIGKILL)")
    orphans.add_argument("--grace", metavar="DUR", help="with --kill: SIGTERM -> SIGKILL delay (default 10s)")
    orphans.add_argument(
        "--json", action="store_true", help="the strays (with --kill: what became of them) as JSON"
    )


def _metrics_arguments(metrics: argparse.ArgumentParser) -> None:
    metrics.add_argument("job", metavar="JOB", help="an id, a name (its newest job) or @last")
    metrics.add_argument("--run", type=int, metavar="N", help="an earlier attempt")
    metrics.add_argument("--since", metavar="DUR", help="only the last DUR (e.g. 10m, 6h, 2d)")
    metrics.add_argument("--json", action="store_true", help="the samples as a JSON list, oldest first")
    metrics.add_argument(
        "--prometheus", action="store_true", help="the Prometheus text exposition, as /metrics serves it"
    )


def _top_arguments(top: argparse.ArgumentParser) -> None:
    top.add_argument("--interval", default="2", metavar="DUR", help="refresh every DUR (default 2s)")
    top.add_argument("-a", "--all", action="store_true", help="include ended jobs (key a toggles)")
    top.add_argument("--read-only", action="store_true", help="no stop or dump keys: look, never touch")


def _web_arguments(web: argparse.ArgumentParser) -> None:
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    web.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free port)")
    web.add_argument("--socket", metavar="PATH", help="listen on this Unix socket (0600) instead")
    web.add_argument("--read-only", action="store_true", help="no stop or dump buttons, no POST at all")
    web.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="H",
        help="also answer requests for this Host name (e.g. behind a proxy); repeatable",
    )


def _health_arguments(health: argparse.ArgumentParser) -> None:
    health.add_argument("job", metavar="JOB", nargs="?", help="default: the newest job")
    health.add_argument("--json", action="store_true", help="the verdict as JSON")


def _diff_arguments(diff: argparse.ArgumentParser) -> None:
    diff.add_argument("job", metavar="A", help="the run to look at: an id, a name (its newest job) or @last")
    diff.add_argument(
        "other",
        metavar="B",
        nargs="?",
        help="compare with this job's last run (default: the last run of A's command, in A's directory, "
        "that succeeded before A's run started)",
    )
    diff.add_argument("--run", type=int, metavar="N", help="A's run N (default: its last)")
    diff.add_argument(
        "--json", action="store_true", help="what changed as JSON: {a, b, changes: [{what, before, after}]}"
    )


def _runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("words", nargs=argparse.REMAINDER)


def _json_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="the report as JSON")


_SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "run": ("start a job (detached) and print its id", _run_arguments),
    "ps": ("list jobs", _ps_arguments),
    "status": ("how a job is doing, or how it ended", _status_arguments),
    "logs": ("show a job's output", _logs_arguments),
    "stop": ("end a job and everything it started", _stop_arguments),
    "wait": (
        "block until a job ends; exit with its status (124: still running at --timeout; 125: no such job)",
        _wait_arguments,
    ),
    "adopt": ("supervise again a job whose supervisor died", _job_and_json),
    "explain": ("why a job died or is stuck", _explain_arguments),
    "metrics": ("a job's CPU, memory, I/O and GPU use over time", _metrics_arguments),
    "dump": ("the Python and native stacks of every process of a job, now", _dump_arguments),
    "profile": (
        "a sampled profile of every process of a running job (py-spy), stored with the run",
        _profile_arguments,
    ),
    "rm": ("forget ended jobs and delete their logs (one JOB, or --ended)", _rm_arguments),
    "orphans": (
        "list processes that should not be alive: leftovers of ended jobs, stray GPU holders",
        _orphans_arguments,
    ),
    "doctor": ("check what jobwarden can do on this machine, and how to fix it", _json_only),
    "health": (
        "a liveness probe: exit 0 if the job runs and is not hung (or succeeded), 1 if hung or failed, 2 if "
        "there is no such job",
        _health_arguments,
    ),
    "completion": ("print a shell completion script (bash, zsh or fish)", _completion_arguments),
    "_jobs": ("", lambda parser: None),  # hidden: the ids and names a completion offers
    "_runs": ("", _runs_arguments),  # hidden: a job's run numbers, for a completion of --run
    "top": (
        "a live view of the jobs in the terminal; stop, dump, explain (needs jobwarden[tui])",
        _top_arguments,
    ),
    "web": ("serve a dashboard and a JSON API of the jobs (127.0.0.1, with a token)", _web_arguments),
    # everyday habits (issue 21)
    "rerun": ("start a job again: the same command, cwd, --env and options, as a new job", _rerun_arguments),
    "queue": ("show queues, or set how many runs of one run at once (--parallel)", _queue_arguments),
    "resume": ("after a reboot: mark the runs it ended, start again those with --restart", _resume_arguments),
    "boot": ("run `jobwarden resume` at every boot: enable, disable or status", _boot_arguments),
    "diff": (
        "what changed between two runs (packages, git commit, env keys, python, host, GPUs), or since the "
        "last success of the same command",
        _diff_arguments,
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = argv[0] if argv else None
    args = _parse(build_parser(first if first in _SUBCOMMANDS else None), argv)
    if args is None:
        return 2
    trace.set_level(args.verbose)
    if args.utc:
        from jobwarden.clock import UTC_ENV, show_utc

        show_utc(True)
        os.environ[UTC_ENV] = "1"  # and in what this command starts: a shim writes times in findings
    else:
        from jobwarden import clock

        clock.default_utc = _config_utc
    from jobwarden.cli import handlers

    try:
        handlers.note_namesakes(args)  # a JOB given by a name that older live jobs share: said first
        return handlers.HANDLERS[args.command](args)
    except JobwardenError as err:  # a message may quote a job's name, command or output: sanitised
        from jobwarden.text.sanitize import terminal_text

        print(f"jobwarden: {terminal_text(err.message)}", file=sys.stderr)
        if err.remedy:
            print(f"  {terminal_text(err.remedy)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141
    except Exception as err:  # a bug of ours: one clear line, the traceback only when asked for
        return _internal_error(err)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    """The arguments, or None once an unknown option was reported: named with the nearest option of its
    command, and nothing run (`run --hang-timout 5m -- CMD` must not start CMD without its timeout)."""
    try:
        args, unknown = parser.parse_known_args(argv)
    except _UnknownCommand as err:
        from jobwarden.text.sanitize import terminal_text  # its patterns: only on the way to an error

        hint = _did_you_mean(err.word, public_commands())
        print(f"jobwarden: unknown command {terminal_text(repr(err.word))}{hint}", file=sys.stderr)
        print("  jobwarden --help lists the commands", file=sys.stderr)
        return None
    if not unknown:
        return args
    from jobwarden.text.sanitize import terminal_text

    command = getattr(args, "command", None)
    sub = _subparser(parser, command) or parser
    options = [o for action in sub._actions for o in action.option_strings if o.startswith("--")]
    word = next((u for u in unknown if u.startswith("-")), unknown[0])
    what = (
        f"unknown option {word.split('=', 1)[0]}" if word.startswith("-") else f"unexpected argument {word}"
    )
    where = f"jobwarden {command}" if command else "jobwarden"
    hint = _did_you_mean(word.split("=", 1)[0], options) if word.startswith("--") else ""
    print(f"{where}: {terminal_text(what)}{hint}", file=sys.stderr)
    print(f"  {where} --help lists its options", file=sys.stderr)
    return None


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    return None


def _config_utc() -> bool:
    """The config file's `[display] utc`, read once the first time is shown."""
    from jobwarden.control.configfile import display_utc

    return display_utc()


def _internal_error(err: Exception) -> int:
    from jobwarden.text.sanitize import one_line

    print(f"jobwarden: internal error: {type(err).__name__}: {one_line(str(err))}", file=sys.stderr)
    if trace.enabled(2):
        import traceback

        traceback.print_exc()
    else:
        print("  a bug in jobwarden: rerun with -vv for its traceback, and report it", file=sys.stderr)
    return 70  # EX_SOFTWARE


def console_entry() -> None:
    """The `jobwarden` command and `python -m jobwarden`: main(), then an immediate exit. Tearing the
    interpreter down (every module and object, one by one) takes 10-15 ms after the work is done, and
    `run` waits for nothing so long. Nothing is lost: every store handle is closed when main() returns,
    the CLI starts no threads that outlive a command, and the streams are flushed here."""
    try:
        code = main()
    except KeyboardInterrupt:  # a Ctrl-C while the interpreter was still loading jobwarden
        code = 130
    try:
        if sys.stdout is not None:  # None when started with fd 1 closed
            sys.stdout.flush()
    except BrokenPipeError:  # `jobwarden ps | head -1`
        code = code or 141
    except OSError as err:  # `jobwarden ps > file` on a full disk
        code = code or 1
        with contextlib.suppress(OSError, AttributeError):
            print(f"jobwarden: cannot write the output: {err.strerror}", file=sys.stderr)
    with contextlib.suppress(OSError, AttributeError):
        sys.stderr.flush()
    os._exit(code)

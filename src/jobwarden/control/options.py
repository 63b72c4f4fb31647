"""`run`'s flags parsed in one place into the job's typed options (joboptions.JobOptions). Every value is
checked before anything starts, and a bad one is a one-line error that names its flag."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from jobwarden import config
from jobwarden.control.engine import detect_engine, engine_place
from jobwarden.errors import UsageError
from jobwarden.joboptions import JobOptions
from jobwarden.paths import GROUP_DIR_ENV


def run_options(
    *,
    timeout: str | None = None,
    grace: str | None = None,
    hang_timeout: str | None = None,
    on_hang: str = "dump",
    py_hooks: bool = True,
    mp_start: str | None = None,
    restart: str | None = None,
    max_restarts: str | None = None,
    restart_delay: str | None = None,
    mem_limit: str | None = None,
    gpus: str | None = None,
    gpu_ids: str | None = None,
    notify: str | None = None,
    on_event: str | None = None,
    engine: dict[str, Any] | None = None,
    log_max: str | None = None,
    keep_running: list[str] | None = None,
    queue: str | None = None,
    after: list[int] | None = None,
    web_url: str | None = None,
) -> JobOptions:
    """The job's options from `run`'s flags, as typed (None: the flag was not given). `after` holds job
    ids (the references resolved against the store), `web_url` the config file's [web] url."""
    options: dict[str, Any] = {
        "timeout_s": config.optional_duration(timeout, "--timeout"),
        "grace_s": config.optional_duration(grace, "--grace"),
        "on_hang": on_hang,
        "py_hooks": py_hooks,
        "mp_start": mp_start,
        "restart_delay_s": config.optional_duration(restart_delay, "--restart-delay"),
    }
    if hang_timeout is not None:  # "off" is stored as 0: no window
        off = hang_timeout.strip().lower() == "off"
        options["hang_timeout_s"] = 0.0 if off else config.parse_duration(hang_timeout, "--hang-timeout")
    options.update(memory_and_restart_options(mem_limit, restart, max_restarts))
    options.update(gpu_options(gpus, gpu_ids))
    options.update(notify_options(notify, on_event))
    options.update(habit_options(log_max, keep_running, queue, after))
    if web_url is not None and (notify is not None or on_event is not None):
        options["web_url"] = web_url  # only where it is said: in a notification
    options.update(engine or {})
    slurm = options.get("own_cgroup") is False and options.get("engine") != "container"
    if mem_limit is not None and slurm:  # inside Slurm, attached or not; a container's is the RSS watchdog
        raise UsageError(
            "--mem-limit does not apply under Slurm: Slurm limits the job's memory itself",
            "ask Slurm for it with --mem (sbatch/srun --mem=8G); Slurm then reports an OOM as OUT_OF_MEMORY",
        )
    return JobOptions.from_json(options)


def memory_and_restart_options(
    mem_limit: str | None, restart: str | None, max_restarts: str | None
) -> dict[str, Any]:
    """--mem-limit, --restart and --max-restarts as the job's options, checked before anything starts:
    {"mem_limit_bytes": int | None, "restart": "no" | "on-failure" | "always", "max_restarts": int}.
    --max-restarts N alone means --restart on-failure; max_restarts is kept under --restart no too, as
    the budget of --on-hang restart."""
    mode = config.parse_restart_mode(restart) if restart is not None else None
    count = _max_restarts(max_restarts) if max_restarts is not None else None
    if mode == "no" and count:
        shown = config.UNLIMITED_WORD if count == config.UNLIMITED else count
        raise UsageError(
            f"--max-restarts {shown} with --restart no", "drop one of them, or use --restart on-failure"
        )
    if mode is None:
        mode = "on-failure" if count else "no"
    return {
        "mem_limit_bytes": config.parse_mem_limit(mem_limit) if mem_limit is not None else None,
        "restart": mode,
        "max_restarts": count if count is not None else config.DEFAULT_MAX_RESTARTS,
    }


def _max_restarts(text: str) -> int:
    """--max-restarts: a count, or `unlimited` (config.UNLIMITED) for a service that must stay up."""
    if text.strip().lower() == config.UNLIMITED_WORD:
        return config.UNLIMITED
    try:
        return config.parse_count(text, "--max-restarts")
    except UsageError:
        raise UsageError(
            f"bad --max-restarts {text!r}: a whole number, 0 or more, or {config.UNLIMITED_WORD}",
            "e.g. --max-restarts 5, or --restart always --max-restarts unlimited for a service",
        ) from None


def habit_options(
    log_max: str | None, keep_running: list[str] | None, queue: str | None, after: list[int] | None
) -> dict[str, Any]:
    """--log-max, --keep-running, --queue and --after (ids) as the job's options, checked."""
    options: dict[str, Any] = {"log_max_bytes": _log_max(log_max) if log_max is not None else None}
    if keep_running:
        options["keep_running"] = [_pattern(p) for p in keep_running]
    if queue is not None:
        options["queue"] = queue_name(queue)
    if after:
        options["after"] = sorted(set(after))
    return options


def _log_max(text: str) -> int:
    """--log-max SIZE, or `off` (stored as 0: the log may grow as long as the disk lets it)."""
    if text.strip().lower() == "off":
        return 0
    size = config.parse_size(text, "--log-max")
    if size < config.MIN_LOG_MAX_BYTES:
        raise UsageError(
            f"--log-max {text} is only {config.format_size(size)}: the log keeps its head and its tail",
            f"give at least {config.format_size(config.MIN_LOG_MAX_BYTES)}, e.g. --log-max 1G (or off)",
        )
    return size


def _pattern(text: str) -> str:
    """--keep-running PATTERN: a regular expression searched in each process's command line (as
    `pgrep -f` does)."""
    if not text.strip():
        raise UsageError("--keep-running needs a pattern", "e.g. --keep-running tensorboard")
    try:
        re.compile(text)
    except re.error as err:
        raise UsageError(
            f"--keep-running {text!r}: not a regular expression ({err})", "e.g. --keep-running 'tensorboard'"
        ) from None
    if _star_height(_regex_parser().parse(text)) > 1:
        raise UsageError(
            f"--keep-running {text!r}: a repeat inside a repeat can take for ever to search a command line",
            "repeat once: e.g. 'a+$' for '(a+)+$', or make the inner repeat possessive: '(a++)+$'",
        )
    return text


def _regex_parser() -> Any:
    """`re`'s own parser (re._parser: private, but the one `re` compiles from since Python 3.11)."""
    import importlib

    return importlib.import_module("re._parser")


def _star_height(items: Any) -> int:
    """How deeply unbounded repeats nest in a parsed pattern: 2 and more can backtrack exponentially
    (`(a+)+$` against 34 a's and a `!` ran for ever). Atomic groups and possessive repeats never
    backtrack into what they matched, so they add nothing. A heuristic: `(a|aa)+$` passes it, and the
    shim bounds every search anyway (shim.run.keeping)."""
    height = 0
    for op, av in items:
        name = str(op)
        inner = 0 if name == "ATOMIC_GROUP" else max(map(_star_height, _subpatterns(av)), default=0)
        if name in ("MAX_REPEAT", "MIN_REPEAT") and av[1] == _regex_parser().MAXREPEAT:
            inner += 1
        height = max(height, inner)
    return height


def _subpatterns(av: Any) -> list[Any]:
    """The parsed sub-patterns inside an item's argument (a group's body, a branch's alternatives...)."""
    if isinstance(av, _regex_parser().SubPattern):
        return [av]
    if isinstance(av, tuple | list):
        return [sub for part in av for sub in _subpatterns(part)]
    return []


def queue_name(text: str) -> str:
    """--queue NAME and `jobwarden queue NAME`: short printable text."""
    if not text or not text.isprintable() or len(text) > 64 or text.startswith("-"):
        raise UsageError(
            f"bad queue name {text!r}: printable text, at most 64 characters", "e.g. --queue gpu"
        )
    return text


def gpu_options(gpus: str | None, gpu_ids: str | None) -> dict[str, Any]:
    """`--gpus N` / `--gpu-ids I,J` as the job options "gpus" (int) and "gpu_ids" (list), both always
    present (None when not asked). Bad values are one-line usage errors."""
    if gpus is not None and gpu_ids is not None:
        raise UsageError("--gpus and --gpu-ids exclude each other", "give a count or a list of GPU ids")
    return {
        "gpus": None if gpus is None else _gpu_count(gpus),
        "gpu_ids": None if gpu_ids is None else _gpu_ids(gpu_ids),
    }


def _gpu_count(text: str) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise UsageError(f"bad --gpus {text!r}: a number of GPUs >= 1", "e.g. --gpus 2")
    return int(value)


def _gpu_ids(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise UsageError(f"bad --gpu-ids {text!r}: GPU indexes >= 0, comma-separated", "e.g. --gpu-ids 0,3")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise UsageError(f"bad --gpu-ids {text!r}: a GPU is named twice", "e.g. --gpu-ids 0,3")
    return ids


def notify_options(url: str | None, command: str | None) -> dict[str, Any]:
    """The job options of `--notify URL` and `--on-event CMD` (read by the shim), checked up front."""
    options: dict[str, Any] = {}
    if url is not None:
        import urllib.parse  # only with --notify: not on every `run`

        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UsageError(
                f"--notify {url.split('?')[0]!r}: not an http(s) URL",
                "give the full address, e.g. --notify https://hooks.slack.com/services/...",
            )
        options["notify"] = url
    if command is not None:
        if not command.strip():
            raise UsageError(
                "--on-event needs a command", "e.g. --on-event 'notify-send jobwarden \"$(cat)\"'"
            )
        options["on_event"] = command
    return options


# srun reports the highest exit code of its tasks: a requeue code at or below a collateral rank's 143
# (SIGTERM) would be masked by it; 253 is what srun itself returns for an OOM (docs/cluster.md)
_REQUEUE_CODES = range(144, 256)
_SRUN_OOM_CODE = 253


def engine_options(
    env: Mapping[str, str],
    *,
    engine: str = "auto",
    detach: bool = False,
    group: str | None = None,
    group_dir: str | None = None,
    rank: str | None = None,
    node: str | None = None,
    requeue_exit: str | None = None,
    max_requeues: str | None = None,
) -> dict[str, Any]:
    """The job options of --engine, --detach, --group, --group-dir, --rank, --requeue-exit and
    --max-requeues, with the engine's defaults (control.engine) under them. `--detach` inside an engine
    runs on its own, as outside one; the group options still apply."""
    place = engine_place(detect_engine(engine, env), env)
    options: dict[str, Any] = {
        "engine": None if detach else place.engine,
        # `--detach` too leaves the run inside Slurm's task cgroup: no memory cgroup of its own there. Nor for
        # a container's entrypoint: the container's cgroup is the one whose limit kills, and whose counters
        # the runtime reads (Kubernetes' OOMKilled); it is read-only inside anyway
        "own_cgroup": place.engine != "slurm" and (place.engine != "container" or detach),
        "group": group_id(group) if group is not None else place.group,
        "group_dir": group_directory(group_dir),
        "rank": config.parse_count(rank, "--rank") if rank is not None else place.rank,
        "node": _node_name(node) if node is not None else place.node,
        "attempt": place.attempt,
        "max_requeues": config.parse_count(max_requeues, "--max-requeues")
        if max_requeues is not None
        else None,
    }
    if options["group_dir"] is None and options["group"] is not None and env.get(GROUP_DIR_ENV):
        # stored with the job: an adopting shim may not have the variable the run had
        options["group_dir"] = group_directory(env[GROUP_DIR_ENV])
    if options["group_dir"] is not None and options["group"] is None:
        raise UsageError("--group-dir needs a group: --group ID (or a Slurm job's own)", "e.g. --group exp-7")
    if requeue_exit is not None:
        options["requeue_exit"] = _requeue_code(requeue_exit)
    return options


def group_id(group: str) -> str:
    """--group: the group directory's name."""
    return _path_component(group, "--group", "a group id", "exp-7")


def group_directory(group_dir: str | None) -> str | None:
    """--group-dir, made absolute here: the shim, an adopting shim and `explain` run from other
    directories."""
    if group_dir is None:
        return None
    if not group_dir or not group_dir.isprintable():
        raise UsageError(
            f"--group-dir {group_dir!r}: not a directory name", "e.g. --group-dir /shared/groups"
        )
    return os.path.abspath(group_dir)


def _node_name(node: str) -> str:
    return _path_component(node, "--node", "a node name", "n1")


def _path_component(text: str, flag: str, what: str, example: str) -> str:
    """One file name of the group directory (the group's own, a node's): no '/', not '.' nor '..'."""
    if not text.isprintable() or "/" in text or text in ("", ".", ".."):
        raise UsageError(f"{flag} {text!r}: {what} is printable text without '/'", f"e.g. {flag} {example}")
    return text


def _requeue_code(text: str) -> int:
    code = config.parse_count(text, "--requeue-exit")
    if code not in _REQUEUE_CODES or code == _SRUN_OOM_CODE:
        raise UsageError(
            f"--requeue-exit {code}: must be 144-255 and not 253",
            "srun exits with its tasks' highest code, so a collateral SIGTERM's 143 would mask a lower one; "
            "253 is srun's own code for an OOM. e.g. --requeue-exit 200, with RequeueExit=200 in slurm.conf "
            "(Slurm) or an onExitCodes rule for 200 in the Job's podFailurePolicy (Kubernetes)",
        )
    return code

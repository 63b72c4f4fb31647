"""Settings and the parsers for the units users type: durations and sizes."""

from __future__ import annotations

import re

from jobwarden.errors import UsageError

# An engine's kill budget (SIGTERM -> its SIGKILL) when it does not say: Slurm's default KillWait
DEFAULT_ENGINE_BUDGET_S = 30.0
DEFAULT_GRACE_S = 10.0  # SIGTERM -> SIGKILL, as docker stop: long enough to write a checkpoint
TICK_S = 1.0  # shim sampling period
FULL_SCAN_EVERY_S = 10.0  # a complete /proc + marker rescan catches anything an incremental scan missed
SHIM_READY_TIMEOUT_S = 30.0
LOW_DISK_BYTES = 1 << 20
# JOBWARDEN_CGROUP=off: contain by subreaper + /proc scanning only, as in a container without a writable
# cgroup (also how the tests prove that path on machines where a cgroup is available)
CGROUP_ENV = "JOBWARDEN_CGROUP"
# JOBWARDEN_PROC_EVENTS=off: no kernel process-event connector, births and deaths from the Python hooks and
# the scan only (as where the connector is refused: containers, kernels before 6.6 without CAP_NET_ADMIN)
PROC_EVENTS_ENV = "JOBWARDEN_PROC_EVENTS"
# JOBWARDEN_PROGRESS=off: the shim reads no progress (neither the log, nor the hooks' records, nor the
# heartbeat's step): scripts/bench's baseline for what watching progress costs
PROGRESS_ENV = "JOBWARDEN_PROGRESS"
# JOBWARDEN_AUTO_PROFILE: the 5 s profile taken when a speed finding appears (shim.watch.autoprofile). "on"
# (the default): not while a CPU quota the supervisor shares with the job throttles; "always"; "off"
AUTO_PROFILE_ENV = "JOBWARDEN_AUTO_PROFILE"
# JOBWARDEN_FINGERPRINT=off: no fingerprint is taken at a launch (no git, no interpreter asked): where a
# repository is too large for `git status` to be worth it, and the baseline of what taking one costs
FINGERPRINT_ENV = "JOBWARDEN_FINGERPRINT"
RESTART_MODES = ("no", "on-failure", "always")
# --restart without --max-restarts: a few tries, never an endless loop (Ray's "infinite oom retries")
DEFAULT_MAX_RESTARTS = 3
# --max-restarts unlimited (a service with --restart always, as pm2 and systemd's Restart=always keep one up):
# stored as this count; the backoff still applies
UNLIMITED = -1
UNLIMITED_WORD = "unlimited"
# --log-max when neither the flag nor the config file says: a chatty job cannot fill the disk, and no sane
# log of one run is near it. The log keeps its first LOG_HEAD_SHARE and its newest bytes (store.logcap)
DEFAULT_LOG_MAX_BYTES = 4 << 30
MIN_LOG_MAX_BYTES = 1 << 20
RESTART_BACKOFF_BASE_S = 1.0
RESTART_BACKOFF_CAP_S = 300.0
# an attempt that ran this long before it failed was healthy: the backoff starts again from its base
# (Kubernetes resets a crash-looping pod's backoff after 10 minutes of running, too)
RESTART_BACKOFF_RESET_S = 600.0
# below this a --mem-limit is surely a forgotten unit ("--mem-limit 512" is 512 bytes): an interpreter
# alone needs more
MIN_MEM_LIMIT_BYTES = 4 << 20
# Larger values are typing mistakes, and would overflow what they reach: a kernel wait in milliseconds is
# a C int (poll(2): 24.8 days), a cgroup memory.max is a u64 that the kernel rounds to pages.
MAX_DURATION_S = 366 * 86400.0
MAX_SIZE_BYTES = 1 << 60  # 1 EiB

_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_duration(text: str, option: str = "") -> float:
    """'90' (seconds), '1.5s', '5m', '1h30m', '2d', '250ms' -> seconds. `option` names the flag the text
    came from in the error ("--timeout: bad duration 'ten minutes'")."""
    raw = text.strip().lower()
    try:
        value = float(raw)
    except ValueError:
        parts = _DURATION_PART.findall(raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise UsageError(
                f"{_named(option)}bad duration {text!r}",
                "use a number of seconds or units like 30s, 5m, 1h30m, 2d",
            ) from None
        value = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if value <= 0 or value != value or value == float("inf"):
        raise UsageError(
            f"{_named(option)}bad duration {text!r}: must be a positive, finite time", "e.g. 30s or 2h"
        )
    if value > MAX_DURATION_S:
        raise UsageError(
            f"{_named(option)}duration {text!r} is longer than {format_duration(MAX_DURATION_S)}",
            "give a shorter time (a job's whole life fits in a year)",
        )
    return value


def optional_duration(text: str | None, option: str) -> float | None:
    """A flag's duration, None when the flag was not given."""
    return parse_duration(text, option) if text is not None else None


def _named(option: str) -> str:
    return f"{option}: " if option else ""


def parse_size(text: str, option: str = "") -> int:
    """'512M', '4G', '1.5GiB', '1000000' -> bytes (binary units: memory limits are pages, not disks)."""
    match = _SIZE.fullmatch(text.strip().lower())
    if not match or match.group(2) not in _SIZE_UNITS:
        raise UsageError(f"{_named(option)}bad size {text!r}", "use bytes or units like 512M, 4G, 1.5GiB")
    number = float(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if number > MAX_SIZE_BYTES:  # and so never int(inf): 400 nines are a float's infinity
        raise UsageError(f"{_named(option)}size {text!r} is beyond any machine's memory", "e.g. 8G")
    value = int(number)
    if value <= 0:
        raise UsageError(f"{_named(option)}bad size {text!r}: must be positive", "e.g. 8G")
    if value > MAX_SIZE_BYTES:
        raise UsageError(f"{_named(option)}size {text!r} is beyond any machine's memory", "e.g. 8G")
    return value


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 descendant', '2 descendants': a count with its noun in the right number, never 'descendant(s)'."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "K", "M", "G"):
        shown = round(value, 0 if unit == "B" else 1)  # compare what is printed: never "1024.0K"
        if shown < 1024:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"


def parse_restart_mode(text: str) -> str:
    """--restart: 'no', 'on-failure' or 'always' (any case)."""
    mode = text.strip().lower()
    if mode not in RESTART_MODES:
        raise UsageError(f"bad --restart {text!r}", f"use one of: {', '.join(RESTART_MODES)}")
    return mode


MAX_COUNT = (1 << 31) - 1  # restarts, requeues, list lengths: more is a typing mistake


def parse_count(text: str, what: str = "count") -> int:
    """A whole number >= 0, e.g. --max-restarts 3."""
    raw = text.strip()
    if not raw.isdecimal():
        raise UsageError(f"bad {what} {text!r}: must be a whole number, 0 or more", f"e.g. {what} 3")
    if len(raw.lstrip("0")) > len(str(MAX_COUNT)) or int(raw) > MAX_COUNT:
        raise UsageError(f"bad {what} {text!r}: more than {MAX_COUNT}", f"e.g. {what} 3")
    return int(raw)


def parse_lines(text: str, option: str = "-n") -> int | None:
    """`logs -n`: how many of the last lines to show, a whole number 0 or more; `all` (None): every line.
    A negative number is refused, not read as "all but": `tail -n -5` means the last 5, `head -n -5` the
    opposite, and a user means one of them."""
    raw = text.strip().lower()
    if raw == "all":
        return None
    if raw.startswith(("-", "+")) and raw[1:].isdecimal():
        raise UsageError(
            f"{option}: bad line count {text!r}: must be 0 or more, or all",
            f"e.g. {option} 5 for the last 5 lines, or {option} all for every line",
        )
    if not raw.isdecimal():
        raise UsageError(
            f"{option}: bad line count {text!r}: must be a whole number or all",
            f"e.g. {option} 20 for the last 20 lines, or {option} all for every line",
        )
    if len(raw.lstrip("0")) > len(str(MAX_COUNT)) or int(raw) > MAX_COUNT:
        raise UsageError(f"{option}: bad line count {text!r}: more than {MAX_COUNT}", f"e.g. {option} 20")
    return int(raw)


# `ps --state`: each run state, and `hung` (running, with a current hang finding)
STATE_WORDS = (
    "queued",
    "starting",
    "running",
    "hung",
    "stopping",
    "restarting",
    "succeeded",
    "failed",
    "stopped",
    "lost",
)


def parse_states(text: str, option: str = "--state") -> frozenset[str]:
    """`ps --state failed,lost`: a comma-separated list of state words (STATE_WORDS), any case."""
    words = [w.strip().lower() for w in text.split(",")]
    if not any(words):
        raise UsageError(f"{option}: no state given", f"e.g. {option} running,failed")
    for word in words:
        if word not in STATE_WORDS:
            shown = word if word.isprintable() and len(word) <= 40 else repr(word[:40])
            raise UsageError(
                f"{option}: unknown state {shown!r}", f"use one or more of {', '.join(STATE_WORDS)}"
            )
    return frozenset(words)


def parse_mem_limit(text: str) -> int:
    """--mem-limit: a size (parse_size) that is big enough to run anything at all."""
    limit = parse_size(text, "--mem-limit")
    if limit < MIN_MEM_LIMIT_BYTES:
        raise UsageError(
            f"--mem-limit {text} is only {format_size(limit)}", f"give a unit, e.g. {text.strip()}M or 8G"
        )
    return limit

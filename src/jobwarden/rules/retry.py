"""Whether to start a run again, and when: pure judgement over how the earlier attempts ended.

The classification follows OpenPAI's job exit spec (microsoft/pai src/job-exit-spec): a failure that will
happen again the same way (a command that cannot start, the same exception at the same place, an OOM at
the same step) is never retried; others are retried up to a budget with backoff, since a restart loop
that cannot succeed only burns the machine (Ray's "infinite oom retries", docs/rules.md "Restarts").
Like systemd's Restart=on-failure, a run ended by the time limit or the hang watchdog counts as a failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobwarden import config
from jobwarden.joboptions import JobOptions

_SHELL_CANNOT_RUN = {126: "found but not executable", 127: "command not found"}  # POSIX shell statuses


@dataclass(frozen=True)
class RestartPolicy:
    mode: str  # "no" | "on-failure" | "always"
    max_restarts: int  # restarts, not attempts: 3 allows 4 runs in all
    backoff_base_s: float = 1.0
    cap_s: float = 300.0
    reset_after_s: float = config.RESTART_BACKOFF_RESET_S

    def __post_init__(self) -> None:
        if self.mode not in config.RESTART_MODES:
            raise ValueError(f"restart mode must be one of {config.RESTART_MODES}, not {self.mode!r}")
        if self.max_restarts < 0 and self.max_restarts != config.UNLIMITED:
            raise ValueError(
                f"max_restarts must not be negative (config.UNLIMITED: no cap), not {self.max_restarts}"
            )
        if min(self.backoff_base_s, self.cap_s, self.reset_after_s) < 0:
            raise ValueError("backoff_base_s, cap_s and reset_after_s must not be negative")

    @property
    def unlimited(self) -> bool:
        """--max-restarts unlimited: a service, restarted whatever the failure (the backoff still applies)."""
        return self.max_restarts == config.UNLIMITED

    @classmethod
    def from_options(cls, options: JobOptions) -> RestartPolicy:
        """The policy a job asked for (--restart, --max-restarts, --restart-delay). Jobs recorded before
        these options existed read as --restart no: they never restart."""
        return cls(
            options.restart,
            options.max_restarts,
            options.restart_delay_s or config.RESTART_BACKOFF_BASE_S,
            config.RESTART_BACKOFF_CAP_S,
        )

    def backoff_s(self, restart: int) -> float:
        """Delay before restart number `restart` (1 for the first): base * 2^(k-1), capped."""
        if self.backoff_base_s == 0:
            return 0.0
        exponent = min(restart - 1, 64)  # 2^64 s is past any cap; keeps the float finite
        return float(min(self.cap_s, self.backoff_base_s * 2.0**exponent))

    def delay_after(self, history: Sequence[AttemptOutcome]) -> float:
        """The backoff grows with each attempt that failed soon after it started, and starts again from
        the base after one that ran for `reset_after_s`: a job that trains for days and then dies is
        not a crash loop, and should not wait out the cap."""
        short = 0
        for attempt in reversed(history):
            if attempt.ran_s is not None and attempt.ran_s >= self.reset_after_s:
                break
            short += 1
        return self.backoff_s(max(short, 1))


@dataclass(frozen=True)
class AttemptOutcome:
    """How one run ended, as far as restarting cares."""

    state: str  # "succeeded" | "failed" | "stopped" | "lost" (model.JobState values)
    exit_code: int | None = None
    signal: str | None = None  # "SIGKILL"
    end_reason: str | None = None  # model.EndReason value: "exited", "spawn-failed", "timeout", ...
    exception: str | None = None  # "ValueError: bad lr @ train.py:42" when it died of one
    oom: bool = False  # killed by the OOM killer or the memory watchdog
    last_output: str | None = None  # the last output line, or the last step marker / heartbeat
    stopped_by_user: bool = False  # `jobwarden stop`
    timed_out: bool = False  # --timeout
    hung: bool = False  # ended by --on-hang restart
    ran_s: float | None = None  # from start to end; None when it never started

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    def describe(self) -> str:
        if self.succeeded:
            return "succeeded (exit 0)"
        if self.timed_out:
            return "ended by --timeout"
        if self.hung:
            return "ended as hung (--on-hang restart)"
        if self.oom:
            return "killed for memory (OOM)"
        if self.signal:
            return f"killed by {self.signal}"
        if self.exit_code is not None:
            return f"failed with exit code {self.exit_code}"
        return f"ended {self.state}"


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    delay_s: float
    reason: str  # one sentence: it becomes the finding's evidence


def decide(policy: RestartPolicy, history: Sequence[AttemptOutcome]) -> RestartDecision:
    """Restart after the last attempt of `history` (oldest first)? Never after `jobwarden stop`; never
    what will fail the same way; then by mode, within max_restarts, after an exponential backoff."""
    if not history:
        raise ValueError("decide() needs the attempt that just ended")
    last = history[-1]
    # a service (--max-restarts unlimited) is kept up even through the same failure twice: a database
    # that is down raises the same error until it is back, as pm2 and systemd's Restart=always assume
    refusal = _never(last) or _by_mode(policy, last) or (None if policy.unlimited else _same_again(history))
    if refusal:
        return RestartDecision(False, 0.0, refusal)
    restarts = len(history) - 1
    if policy.unlimited:
        delay = policy.delay_after(history)
        return RestartDecision(
            True,
            delay,
            f"{last.describe()}; restart {restarts + 1} (--max-restarts unlimited) in {delay:g}s "
            f"({_why_restart(policy, last)})",
        )
    if restarts >= policy.max_restarts:
        return RestartDecision(
            False,
            0.0,
            f"{last.describe()}; not restarted: --max-restarts {policy.max_restarts} reached "
            f"({len(history)} attempt{'s' if len(history) != 1 else ''})",
        )
    delay = policy.delay_after(history)
    return RestartDecision(
        True,
        delay,
        f"{last.describe()}; restart {restarts + 1} of {policy.max_restarts} in {delay:g}s "
        f"({_why_restart(policy, last)})",
    )


def _never(last: AttemptOutcome) -> str | None:
    if last.end_reason == "engine-stop":
        return "ended by the engine it runs in (scancel, a time limit, `ray job stop`): the engine decides"
    if last.stopped_by_user or last.state == "stopped" or last.end_reason == "stopped":
        return "stopped with `jobwarden stop`: a stopped job is never restarted"
    if last.state == "lost":
        return (
            "the run's supervisor died before it ended, so its processes may still be running: not "
            "restarted (`jobwarden adopt` watches them again)"
        )
    if last.end_reason == "dependency-failed":
        return "never started: a job it was to run after (--after) did not succeed; not restarted"
    if last.end_reason == "spawn-failed":
        return (
            f"the command could not be started (exit {last.exit_code}); it would fail the same way again: "
            "not restarted"
        )
    if not last.succeeded and last.signal is None and last.exit_code in _SHELL_CANNOT_RUN:
        what = _SHELL_CANNOT_RUN[last.exit_code]
        return f"exit code {last.exit_code} ({what}, as a shell reports it) would recur: not restarted"
    return None


def _by_mode(policy: RestartPolicy, last: AttemptOutcome) -> str | None:
    if last.hung:
        return None  # --on-hang restart asked for this restart by itself, whatever --restart says
    if policy.mode == "no":
        return f"{last.describe()}; not restarted (--restart no)"
    if last.succeeded and policy.mode == "on-failure":
        return f"{last.describe()}; not restarted: --restart on-failure restarts failed runs only"
    return None


def _same_again(history: Sequence[AttemptOutcome]) -> str | None:
    """The same failure twice in a row, at the same place: a third attempt would meet it again."""
    if len(history) < 2:
        return None
    before, last = history[-2], history[-1]
    if last.exception and last.exception == before.exception:
        return f"the same Python exception twice in a row ({last.exception}): not restarted"
    if last.oom and before.oom and last.last_output is not None and last.last_output == before.last_output:
        return (
            f"killed for memory twice in a row at the same point (last output: {last.last_output!r}): "
            "not restarted; raise --mem-limit or lower the memory use"
        )
    return None


def _why_restart(policy: RestartPolicy, last: AttemptOutcome) -> str:
    if last.hung:
        return "--on-hang restart"
    return f"--restart {policy.mode}"

"""The restart policy: every rule, including where it must not fire."""

from __future__ import annotations

import itertools

import pytest

from jobwarden import config
from jobwarden.joboptions import JobOptions
from jobwarden.rules.retry import AttemptOutcome, RestartDecision, RestartPolicy, decide

OK = AttemptOutcome("succeeded", exit_code=0, end_reason="exited")
EXIT1 = AttemptOutcome("failed", exit_code=1, end_reason="exited")
KILLED = AttemptOutcome("failed", signal="SIGKILL", end_reason="signalled")
SEGV = AttemptOutcome("failed", signal="SIGSEGV", end_reason="signalled")
STOPPED = AttemptOutcome("stopped", signal="SIGTERM", end_reason="stopped", stopped_by_user=True)
TIMED_OUT = AttemptOutcome("failed", signal="SIGTERM", end_reason="timeout", timed_out=True)
HUNG = AttemptOutcome("failed", signal="SIGKILL", end_reason="signalled", hung=True)
NOT_FOUND = AttemptOutcome("failed", exit_code=127, end_reason="spawn-failed")
NOT_EXECUTABLE = AttemptOutcome("failed", exit_code=126, end_reason="spawn-failed")
LOST = AttemptOutcome("lost")


def exc(signature: str) -> AttemptOutcome:
    return AttemptOutcome("failed", exit_code=1, end_reason="exited", exception=signature)


def oom(last_output: str | None) -> AttemptOutcome:
    return AttemptOutcome(
        "failed", signal="SIGKILL", end_reason="signalled", oom=True, last_output=last_output
    )


def policy(mode: str = "on-failure", max_restarts: int = 3, **kw: float) -> RestartPolicy:
    return RestartPolicy(mode, max_restarts, **kw)


# --- by mode ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [EXIT1, KILLED, SEGV, TIMED_OUT])
def test_on_failure_restarts_a_failed_run(outcome: AttemptOutcome) -> None:
    decision = decide(policy("on-failure"), [outcome])
    assert decision.restart is True
    assert "--restart on-failure" in decision.reason


def test_on_failure_does_not_restart_a_success() -> None:
    decision = decide(policy("on-failure"), [OK])
    assert decision == RestartDecision(
        False, 0.0, "succeeded (exit 0); not restarted: --restart on-failure restarts failed runs only"
    )


def test_always_restarts_a_success_too() -> None:
    decision = decide(policy("always"), [OK])
    assert decision.restart is True and decision.reason.startswith("succeeded (exit 0); restart 1 of 3")


@pytest.mark.parametrize("outcome", [OK, EXIT1, KILLED, TIMED_OUT])
def test_no_restarts_nothing(outcome: AttemptOutcome) -> None:
    decision = decide(policy("no"), [outcome])
    assert decision.restart is False and "--restart no" in decision.reason


# --- never -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["no", "on-failure", "always"])
@pytest.mark.parametrize(
    "outcome",
    [
        STOPPED,
        AttemptOutcome("stopped"),  # the state alone says so
        AttemptOutcome("failed", end_reason="stopped"),  # or the end reason
        AttemptOutcome("failed", signal="SIGKILL", stopped_by_user=True),  # or the flag
        AttemptOutcome("failed", signal="SIGKILL", stopped_by_user=True, hung=True),  # stop wins over hang
    ],
)
def test_never_after_jobwarden_stop(mode: str, outcome: AttemptOutcome) -> None:
    decision = decide(policy(mode), [outcome])
    assert decision.restart is False and "jobwarden stop" in decision.reason


@pytest.mark.parametrize("mode", ["no", "on-failure", "always"])
def test_never_a_lost_run_whose_processes_may_still_run(mode: str) -> None:
    decision = decide(policy(mode), [LOST])
    assert decision.restart is False and "jobwarden adopt" in decision.reason


def test_a_lost_run_before_the_last_one_does_not_matter() -> None:
    assert decide(policy(), [LOST, EXIT1]).restart is True


@pytest.mark.parametrize("mode", ["on-failure", "always"])
@pytest.mark.parametrize(("outcome", "shown"), [(NOT_FOUND, "exit 127"), (NOT_EXECUTABLE, "exit 126")])
def test_never_a_command_that_could_not_start(mode: str, outcome: AttemptOutcome, shown: str) -> None:
    decision = decide(policy(mode), [outcome])
    assert decision.restart is False
    assert "could not be started" in decision.reason and shown in decision.reason


@pytest.mark.parametrize(("code", "what"), [(127, "command not found"), (126, "not executable")])
def test_never_a_shell_that_could_not_run_its_command(code: int, what: str) -> None:
    # `sh -c 'trian.py'`: the job started, but its shell reports the command as missing
    decision = decide(policy(), [AttemptOutcome("failed", exit_code=code, end_reason="exited")])
    assert decision.restart is False and what in decision.reason


def test_exit_code_127_after_a_signal_is_not_the_shells() -> None:
    outcome = AttemptOutcome("failed", exit_code=127, signal="SIGKILL", end_reason="signalled")
    assert decide(policy(), [outcome]).restart is True


# --- the same failure again ---------------------------------------------------------------------------


def test_the_same_exception_at_the_same_place_twice_is_not_restarted() -> None:
    signature = "ValueError: bad lr @ train.py:42"
    assert decide(policy(), [exc(signature)]).restart is True  # once may be bad luck
    decision = decide(policy(), [exc(signature), exc(signature)])
    assert decision.restart is False
    assert decision.reason == f"the same Python exception twice in a row ({signature}): not restarted"


@pytest.mark.parametrize(
    "history",
    [
        [exc("ValueError: bad lr @ train.py:42"), exc("ValueError: bad lr @ train.py:50")],  # elsewhere
        [exc("ValueError: bad lr @ train.py:42"), exc("KeyError: 'x' @ train.py:42")],  # another one
        [exc("ValueError: x @ a.py:1"), EXIT1, exc("ValueError: x @ a.py:1")],  # not in a row
        [EXIT1, EXIT1],  # no exception to compare
    ],
)
def test_a_different_or_unknown_exception_is_restarted(history: list[AttemptOutcome]) -> None:
    assert decide(policy(), history).restart is True


def test_the_same_oom_at_the_same_step_twice_is_not_restarted() -> None:
    decision = decide(policy(), [oom("step 1200 loss 2.31"), oom("step 1200 loss 2.31")])
    assert decision.restart is False
    assert "twice in a row at the same point" in decision.reason and "step 1200" in decision.reason
    assert "--mem-limit" in decision.reason


@pytest.mark.parametrize(
    "history",
    [
        [oom("step 1200"), oom("step 1900")],  # got further: it may yet get through
        [oom(None), oom(None)],  # nothing to tell the place by
        [oom("step 1200"), AttemptOutcome("failed", exit_code=1, last_output="step 1200")],  # not an OOM
        [oom("step 1200"), EXIT1, oom("step 1200")],  # not in a row
    ],
)
def test_an_oom_elsewhere_or_unplaced_is_restarted(history: list[AttemptOutcome]) -> None:
    assert decide(policy(), history).restart is True


def test_a_single_oom_is_restarted() -> None:
    decision = decide(policy(), [oom("step 1")])
    assert decision.restart is True and "killed for memory (OOM)" in decision.reason


# --- hangs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["no", "on-failure", "always"])
def test_a_run_ended_by_on_hang_restart_is_restarted(mode: str) -> None:
    decision = decide(policy(mode), [HUNG])
    assert decision.restart is True and "--on-hang restart" in decision.reason


def test_a_hang_twice_at_the_same_place_is_still_restarted() -> None:
    hung = AttemptOutcome("failed", signal="SIGKILL", hung=True, last_output="epoch 3")
    assert decide(policy(), [hung, hung]).restart is True


def test_hang_restarts_count_against_the_budget() -> None:
    decision = decide(policy("no", max_restarts=1), [HUNG, HUNG])
    assert decision.restart is False and "--max-restarts 1 reached" in decision.reason


# --- the budget and the backoff -------------------------------------------------------------------------


def test_max_restarts_counts_restarts_not_attempts() -> None:
    assert decide(policy(max_restarts=2), [EXIT1]).restart is True  # restart 1
    assert decide(policy(max_restarts=2), [EXIT1, KILLED]).restart is True  # restart 2
    decision = decide(policy(max_restarts=2), [EXIT1, KILLED, EXIT1])
    assert decision == RestartDecision(
        False, 0.0, "failed with exit code 1; not restarted: --max-restarts 2 reached (3 attempts)"
    )


def test_zero_restarts_allows_none() -> None:
    decision = decide(policy(max_restarts=0), [EXIT1])
    assert decision.restart is False and "(1 attempt)" in decision.reason


def test_the_backoff_doubles_from_the_base() -> None:
    p = policy(max_restarts=10, backoff_base_s=1.0, cap_s=300.0)
    delays = [decide(p, [EXIT1] * n).delay_s for n in range(1, 7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


def test_the_backoff_is_capped() -> None:
    p = policy(max_restarts=100, backoff_base_s=1.0, cap_s=300.0)
    assert decide(p, [EXIT1] * 9).delay_s == 256.0
    assert decide(p, [EXIT1] * 10).delay_s == 300.0
    assert decide(p, [EXIT1] * 99).delay_s == 300.0


def test_the_backoff_starts_again_after_an_attempt_that_ran_long() -> None:
    p = policy(max_restarts=10, backoff_base_s=1.0, cap_s=300.0, reset_after_s=600.0)
    ran_an_hour = AttemptOutcome("failed", exit_code=1, end_reason="exited", ran_s=3600.0)
    assert decide(p, [EXIT1] * 4).delay_s == 8.0
    assert decide(p, [*[EXIT1] * 4, ran_an_hour]).delay_s == 1.0
    # the quick failures after it are a new streak
    assert decide(p, [*[EXIT1] * 4, ran_an_hour, EXIT1]).delay_s == 1.0
    assert decide(p, [*[EXIT1] * 4, ran_an_hour, EXIT1, EXIT1]).delay_s == 2.0


def test_an_attempt_short_of_the_reset_still_grows_the_backoff() -> None:
    p = policy(max_restarts=10, backoff_base_s=1.0, reset_after_s=600.0)
    almost = AttemptOutcome("failed", exit_code=1, end_reason="exited", ran_s=599.0)
    assert decide(p, [almost] * 3).delay_s == 4.0


def test_a_huge_restart_number_stays_finite() -> None:
    assert policy(backoff_base_s=2.0, cap_s=60.0).backoff_s(10_000) == 60.0


def test_a_zero_base_restarts_at_once() -> None:
    assert decide(policy(backoff_base_s=0.0), [EXIT1, EXIT1]).delay_s == 0.0


def test_the_reason_of_a_restart_says_which_and_when() -> None:
    decision = decide(policy(max_restarts=3, backoff_base_s=5.0), [KILLED, KILLED])
    assert decision == RestartDecision(
        True, 10.0, "killed by SIGKILL; restart 2 of 3 in 10s (--restart on-failure)"
    )


def test_a_refusal_has_no_delay() -> None:
    for history in ([OK], [STOPPED], [NOT_FOUND], [exc("E: x @ a:1")] * 2):
        assert decide(policy(), history).delay_s == 0.0


# --- the whole table ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "outcome"), list(itertools.product(["no", "on-failure", "always"], [OK, EXIT1, STOPPED, HUNG]))
)
def test_the_mode_table(mode: str, outcome: AttemptOutcome) -> None:
    expected = {
        ("no", "OK"): False,
        ("no", "EXIT1"): False,
        ("no", "STOPPED"): False,
        ("no", "HUNG"): True,
        ("on-failure", "OK"): False,
        ("on-failure", "EXIT1"): True,
        ("on-failure", "STOPPED"): False,
        ("on-failure", "HUNG"): True,
        ("always", "OK"): True,
        ("always", "EXIT1"): True,
        ("always", "STOPPED"): False,
        ("always", "HUNG"): True,
    }
    name = {OK: "OK", EXIT1: "EXIT1", STOPPED: "STOPPED", HUNG: "HUNG"}[outcome]
    assert decide(policy(mode), [outcome]).restart is expected[(mode, name)]


# --- from the job's options -----------------------------------------------------------------------------


def test_the_policy_of_a_jobs_options() -> None:
    from jobwarden.control.options import run_options

    options = run_options(restart="always", max_restarts="5")
    assert RestartPolicy.from_options(options) == RestartPolicy("always", 5, 1.0, 300.0)
    slow = run_options(restart="on-failure", restart_delay="30s")
    assert RestartPolicy.from_options(slow) == RestartPolicy("on-failure", 3, 30.0, 300.0)


def test_a_job_recorded_before_restarts_existed_never_restarts() -> None:
    old = RestartPolicy.from_options(JobOptions.from_json({"timeout_s": None, "grace_s": 10.0}))
    assert old.mode == "no" and decide(old, [EXIT1]).restart is False


# --- bad input ------------------------------------------------------------------------------------------


def test_an_empty_history_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        decide(policy(), [])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "sometimes", "max_restarts": 1},
        {"mode": "no", "max_restarts": -2},  # -1 is config.UNLIMITED
        {"mode": "always", "max_restarts": 1, "backoff_base_s": -1.0},
        {"mode": "always", "max_restarts": 1, "cap_s": -1.0},
        {"mode": "always", "max_restarts": 1, "reset_after_s": -1.0},
    ],
)
def test_a_bad_policy_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcome", "text"),
    [
        (OK, "succeeded (exit 0)"),
        (EXIT1, "failed with exit code 1"),
        (KILLED, "killed by SIGKILL"),
        (TIMED_OUT, "ended by --timeout"),
        (HUNG, "ended as hung (--on-hang restart)"),
        (oom("x"), "killed for memory (OOM)"),
        (LOST, "ended lost"),
    ],
)
def test_outcomes_describe_themselves(outcome: AttemptOutcome, text: str) -> None:
    assert outcome.describe() == text


# --- a service: --restart always --max-restarts unlimited (issue 21) ----------------------------------


def test_unlimited_restarts_past_any_count_with_the_backoff_capped() -> None:
    service = policy("always", config.UNLIMITED)
    history = [EXIT1] * 50
    decision = decide(service, history)
    assert decision.restart is True
    assert decision.delay_s == config.RESTART_BACKOFF_CAP_S  # the backoff stays: 1, 2, 4, ... up to 5 min
    assert "restart 50 (--max-restarts unlimited)" in decision.reason


def test_unlimited_keeps_a_service_up_through_the_same_failure_twice() -> None:
    """A service whose database is down raises the same error until it is back: restarted anyway."""
    same = exc("ConnectionError: db down @ serve.py:10")
    assert decide(policy("always", config.UNLIMITED), [same, same]).restart is True
    assert decide(policy("always", 5), [same, same]).restart is False


@pytest.mark.parametrize("outcome", [STOPPED, NOT_FOUND, LOST])
def test_unlimited_still_never_restarts_what_must_not_be(outcome: AttemptOutcome) -> None:
    assert decide(policy("always", config.UNLIMITED), [outcome]).restart is False


def test_a_run_cancelled_by_its_dependency_is_never_restarted() -> None:
    cancelled = AttemptOutcome("failed", end_reason="dependency-failed")
    decision = decide(policy("always", config.UNLIMITED), [cancelled])
    assert decision.restart is False and "--after" in decision.reason

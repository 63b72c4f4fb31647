"""`jobwarden health` and /healthz judge alike (control.health.judge): each state, a hang, a hang the job
moved on from; and the probe never creates a home."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.control.health import FAILED, HUNG, NO_JOB, OK, Health, Progress, health, judge
from jobwarden.model import JobState
from tests.unit.test_container import run_record

HUNG_AT = 1_700_000_050.0
NOTHING = Progress(None, None, None)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (JobState.RUNNING, OK),
        (JobState.QUEUED, OK),
        (JobState.STARTING, OK),
        (JobState.RESTARTING, OK),
        (JobState.STOPPING, OK),
        (JobState.SUCCEEDED, OK),
        (JobState.FAILED, FAILED),
        (JobState.STOPPED, FAILED),
        (JobState.LOST, FAILED),
    ],
)
def test_each_state(state: JobState, status: str) -> None:
    verdict = judge(run_record(state, exit_code=3 if state == JobState.FAILED else None), None, NOTHING)
    assert verdict.status == status
    assert verdict.exit_code == (0 if status == OK else 1)
    assert verdict.http == ((200, "ok") if status == OK else (503, "failed"))


def test_a_failure_says_how_it_ended() -> None:
    assert judge(run_record(JobState.FAILED, exit_code=3), None, NOTHING).reason == "failed (exit code 3)"
    assert judge(run_record(JobState.LOST), None, NOTHING).reason == "lost"


def test_hung_until_a_sign_of_progress_comes_after_the_hang() -> None:
    running = run_record(JobState.RUNNING)
    hung = judge(running, HUNG_AT, Progress(HUNG_AT - 30, None, HUNG_AT - 40))
    assert (hung.status, hung.exit_code, hung.http, hung.hung_at) == (HUNG, 1, (503, "hung"), HUNG_AT)
    assert hung.to_json()["healthy"] is False and hung.to_json()["status"] == "hung"
    for moved in (
        Progress(HUNG_AT + 1, None, None),  # output again
        Progress(None, HUNG_AT + 1, None),  # a heartbeat
        Progress(None, None, HUNG_AT + 1),  # the tree busy above the watchdog's CPU floor
    ):
        assert judge(running, HUNG_AT, moved).status == OK
    # ended as hung (--on-hang stop) is a failure: it no longer runs
    assert judge(run_record(JobState.FAILED, end_reason="hung"), HUNG_AT, NOTHING).status == FAILED
    assert judge(run_record(JobState.STOPPING), HUNG_AT, NOTHING).status == HUNG


def test_a_hang_names_the_last_sign_of_life_not_the_moment_it_was_judged() -> None:
    from jobwarden.clock import shown_time

    hung = judge(run_record(JobState.RUNNING), HUNG_AT, Progress(HUNG_AT - 15, None, HUNG_AT - 40))
    assert hung.reason == (
        f"hung since {shown_time(HUNG_AT)}; last sign of progress: its output at {shown_time(HUNG_AT - 15)}"
    )
    silent = judge(run_record(JobState.RUNNING), HUNG_AT, NOTHING)
    assert silent.reason.endswith("; no sign of progress seen since it started")


def test_a_short_span_is_shown_to_the_second() -> None:
    from jobwarden.clock import shown_span, shown_time

    assert (
        shown_span(HUNG_AT, HUNG_AT + 15)
        == f"{shown_time(HUNG_AT, 'time')}–{shown_time(HUNG_AT + 15, 'time')}"
    )
    assert shown_span(HUNG_AT, HUNG_AT + 3600) == (
        f"{shown_time(HUNG_AT, 'minute')}–{shown_time(HUNG_AT + 3600, 'minute')}"
    )
    assert ":" in shown_span(HUNG_AT, HUNG_AT).split("–")[0][3:]  # 06:33:23–06:33:23, never 06:33–06:33


def test_no_job_is_exit_2_and_a_probe_never_creates_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    verdict = health(home)
    assert (verdict.status, verdict.exit_code, verdict.http) == (NO_JOB, 2, (503, "failed"))
    assert not home.exists()
    assert Health(NO_JOB, "x").to_json()["id"] is None

"""`stop`'s report (text.render.stop_report) says what is known of how the job ended, never 'None'; and a
job's name is capped (control.launch)."""

from __future__ import annotations

from typing import Any

import pytest

from jobwarden.control.launch import MAX_NAME, checked_name, default_name
from jobwarden.control.lifecycle import StopResult
from jobwarden.errors import UsageError
from jobwarden.model import JobState, Survivor
from jobwarden.store import RunRecord
from jobwarden.text.render import stop_report


def run(**fields: Any) -> RunRecord:
    base: dict[str, Any] = {
        "job_id": 4,
        "n": 1,
        "state": JobState.STOPPED,
        "shim_pid": 90,
        "shim_start": 1,
        "pid": 100,
        "pid_start": 1,
        "started_at": 1_764_000_000.0,
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "wait_status": None,
        "end_reason": None,
        "error": None,
        "stop_requested_at": None,
        "stop_grace": None,
        "containment": None,
        "orphans_left": [],
        "survivors": [],
    }
    return RunRecord(**{**base, **fields})


def test_a_stop_whose_supervisor_died_says_so_never_exit_code_none() -> None:
    lost = run(state=JobState.LOST)
    (line,) = stop_report(StopResult(lost, False, []))
    assert "None" not in line
    assert line == (
        "stopped job 4 (its supervisor died during the stop, before it recorded how the main process "
        "ended; nothing of the job runs now)"
    )
    alive = [Survivor(101, "python train.py", "its supervisor died while stopping it")]
    first, survivor = stop_report(StopResult(lost, False, alive))
    assert "nothing of the job runs now" not in first and "None" not in first
    assert survivor.startswith("  still alive: pid 101")


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"signal": "SIGTERM"}, "stopped job 4 (main process: killed by SIGTERM)"),
        ({"exit_code": 0}, "stopped job 4 (main process: exit code 0)"),
        ({"state": JobState.STOPPING}, "stopped job 4 (how its main process ended is not recorded; "),
    ],
)
def test_a_stop_says_how_the_main_process_ended_where_known(fields: dict[str, Any], said: str) -> None:
    (line,) = stop_report(StopResult(run(**fields), False, []))
    assert line.startswith(said) and "None" not in line


def test_a_name_longer_than_the_cap_is_refused_naming_the_option() -> None:
    assert checked_name("n" * MAX_NAME) == "n" * MAX_NAME
    with pytest.raises(UsageError, match=r"--name 'nnnnnnnnnnnnnnnnnnnn'\.\.\.: 100000 characters") as err:
        checked_name("n" * 100_000)
    assert len(str(err.value)) < 200  # the message does not repeat the whole name


def test_a_default_name_from_a_long_command_is_capped() -> None:
    assert len(default_name(["/opt/" + "s" * 255])) <= MAX_NAME
    assert default_name(["/opt/" + "7" * 255]).startswith("job-")

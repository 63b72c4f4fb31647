"""`disk-full` (rules.disk): a warning while the job ran on, the root cause when the job then failed with a
bare exit code while the disk holding its log was still full."""

from __future__ import annotations

import pytest

from jobwarden.rules import explain

from .test_rules import assert_well_formed, evidence, rules_of

HOME = "/small/home/jobs/1/run-1"
FULL = ("started", "disk-full", "ended")


def test_a_job_that_exits_1_on_a_full_disk_is_blamed_on_the_disk() -> None:
    """It was 'exited with code 1, no clearer sign why' first, and the disk-full warning said 'the job
    itself ran on'."""
    ev = evidence(state="failed", exit_code=1, log_tail=("epoch 3",), events=FULL, disk_full=(HOME,))
    findings = explain(ev)
    assert rules_of(findings) == ["disk-full"]  # the bare exit code is not said as well
    (cause,) = findings
    assert cause.severity == "error" and "exit code 1" in cause.title
    assert "ran on" not in cause.summary and "no clearer sign" not in cause.summary
    assert cause.evidence[:2] == (
        f"exit code 1 while no space was left on device under {HOME}",
        "output: epoch 3",
    )
    assert cause.pids == (4665,)
    assert_well_formed(findings)


def test_the_disk_leads_the_aftermath_that_follows_it() -> None:
    orphans = [{"pid": 4711, "cmdline": "python worker.py"}]
    ev = evidence(state="failed", exit_code=1, events=FULL, disk_full=(HOME,), orphans_left=orphans)
    assert rules_of(explain(ev)) == ["disk-full", "orphans-left"]


@pytest.mark.parametrize(
    ("changes", "rules"),
    [
        # the disk had room again before the job ended: the exit code is not laid on it
        ({"exit_code": 1, "events": ("disk-full", "disk-ok", "ended")}, ["exit-code", "disk-full"]),
        # a job that succeeded ran on
        ({"state": "succeeded", "exit_code": 0}, ["disk-full"]),
        # a signal or an exception explains the end better
        ({"exit_code": None, "signal": "SIGKILL"}, ["killed-externally", "disk-full"]),
        (
            {"exit_code": 1, "log_tail": ("Traceback (most recent call last):", "KeyError: 'lr'")},
            ["python-exception", "disk-full"],
        ),
    ],
)
def test_the_disk_is_only_a_warning_where_something_else_explains_the_end(
    changes: dict[str, object], rules: list[str]
) -> None:
    ev = evidence(**{"state": "failed", "events": FULL, "disk_full": (HOME,), **changes})
    findings = explain(ev)
    assert rules_of(findings) == rules
    (disk,) = [f for f in findings if f.rule == "disk-full"]
    assert disk.severity == "warning" and "the job itself ran on" in disk.summary

"""Remedies that fit the evidence: a command names the real job, never `JOB`; an option the run already
has is never offered as the fix; a fork deadlock whose code asked for fork by name is sent to that line."""

from __future__ import annotations

import dataclasses

import pytest

from jobwarden.observations import ForkRequest, Frame
from jobwarden.rules import RunEvidence, explain
from tests.fixtures.stacks.pyspy import recording

from .test_rules import evidence

DEMO = "/srv/demo/deadlock.py"
CONTEXT = "/usr/lib/python3.11/multiprocessing/context.py"


def asked_for_fork(pid: int, api: str) -> ForkRequest:
    """The hooks' record of get_context("fork") / set_start_method("fork") at demo/deadlock.py:29."""
    inside = (Frame("BaseContext.get_context", CONTEXT, 243),)
    if api == "set_start_method":
        inside += (Frame("DefaultContext.set_start_method", CONTEXT, 247),)
    else:
        inside += (Frame("DefaultContext.get_context", CONTEXT, 238),)
    return ForkRequest(pid, 1.0, (*inside, Frame("<module>", DEMO, 29)))


def fork_deadlock(**changes: object) -> RunEvidence:
    rec = recording("fork_mp")
    return dataclasses.replace(rec.evidence(), **changes)


def remedy(ev: RunEvidence, rule: str) -> str:
    return next(f.remedy for f in explain(ev) if f.rule == rule)


@pytest.mark.parametrize("api", ["get_context", "set_start_method"])
def test_a_fork_asked_for_by_name_is_fixed_at_that_line_not_with_mp_start(api: str) -> None:
    base = fork_deadlock()
    parent = next(f.parent_pid for f in base.forks)
    ev = dataclasses.replace(base, fork_requests=(asked_for_fork(parent, api),))
    text = remedy(ev, "fork-deadlock")
    assert f"{api}('fork') at {DEMO}:29" in text
    assert f"{api}('forkserver')" in text
    assert "--mp-start cannot change" in text and "`jobwarden run --mp-start" not in text
    finding = next(f for f in explain(ev) if f.rule == "fork-deadlock")
    assert f"the fork start method was asked for by name: {api}('fork') at {DEMO}:29" in finding.evidence


def test_a_request_by_another_process_is_not_this_forks() -> None:
    base = fork_deadlock()
    parent = next(f.parent_pid for f in base.forks)
    ev = dataclasses.replace(base, fork_requests=(asked_for_fork(parent + 1000, "get_context"),))
    assert "`jobwarden run --mp-start forkserver`" in remedy(ev, "fork-deadlock")  # the default was used


def test_mp_start_in_force_is_not_offered_again() -> None:
    text = remedy(fork_deadlock(mp_start="forkserver"), "fork-deadlock")
    assert "--mp-start forkserver was in force" in text
    assert "`jobwarden run --mp-start" not in text


def test_commands_name_the_real_job() -> None:
    hung = recording("fork_mp").evidence(job_id=42)  # no fork record: the collective family aside
    quiet = dataclasses.replace(hung, forks=(), stacks=(), processes=())
    assert "`jobwarden dump 42`" in remedy(quiet, "no-progress")
    lost = evidence(state="lost", exit_code=None, end_reason=None, job_id=42)
    assert "`jobwarden adopt 42`" in remedy(lost, "supervisor-lost")
    for f in (*explain(quiet), *explain(lost)):
        assert "JOB " not in f.remedy and "JOB`" not in f.remedy, f


def test_a_mem_limit_already_set_is_not_suggested() -> None:
    killed = evidence(exit_code=None, signal="SIGKILL", end_reason="signalled")
    assert "run with --mem-limit" in remedy(killed, "killed-externally")
    limited = dataclasses.replace(killed, mem_limit_bytes=1 << 30)
    assert "--mem-limit" not in remedy(limited, "killed-externally")


def test_a_kill_inside_a_container_is_looked_up_on_the_host() -> None:
    killed = evidence(exit_code=None, signal="SIGKILL", end_reason="signalled", engine="container")
    text = remedy(killed, "killed-externally")
    assert "OOMKilled" in text and "on the host" in text
    assert "--mem-limit" not in text and "`last`" not in text  # no limit to set inside, no login to read


def test_a_missing_module_names_the_interpreter_that_ran_and_the_package_to_install() -> None:
    """'fix the error at train.py:1' did not help: the module is installed, for another interpreter."""
    from jobwarden.observations import UncaughtException

    venv = "/srv/exp/.venv/bin/python3"
    missing = UncaughtException(
        4665, 1.0, "ModuleNotFoundError", "No module named 'cv2'",
        (Frame("<module>", "/srv/exp/train.py", 1),), executable=venv,
    )  # fmt: skip
    ev = evidence(state="failed", exit_code=1, exceptions=(missing,))
    said = remedy(ev, "python-exception")
    assert f"not installed for the interpreter that ran the job, {venv}" in said
    assert f"`{venv} -m pip install opencv-python`" in said  # the package, not the import name
    assert "fix the error at" not in said
    unknown = evidence(
        state="failed", exit_code=1, exceptions=(dataclasses.replace(missing, executable=None),)
    )
    assert "not installed for the Python that ran the job" in remedy(unknown, "python-exception")


def test_a_relative_path_not_found_points_at_the_jobs_working_directory() -> None:
    from jobwarden.observations import UncaughtException

    lost = UncaughtException(
        4665, 1.0, "FileNotFoundError", "[Errno 2] No such file or directory: 'data/train.csv'",
        (Frame("load", "/srv/exp/train.py", 12),),
    )  # fmt: skip
    said = remedy(evidence(state="failed", exit_code=1, exceptions=(lost,)), "python-exception")
    assert "'data/train.csv' is a relative path" in said and "--cwd" in said
    absolute = dataclasses.replace(lost, message="[Errno 2] No such file or directory: '/data/train.csv'")
    plain = remedy(evidence(state="failed", exit_code=1, exceptions=(absolute,)), "python-exception")
    assert plain.startswith("fix the error at /srv/exp/train.py:12 in load")

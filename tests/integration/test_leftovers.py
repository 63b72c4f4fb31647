"""Leftovers of earlier rounds (issue 20, item 10): each test here failed before its fix."""

from __future__ import annotations

import pytest

from tests.conftest import Jobwarden

pytestmark = pytest.mark.integration

JOB_COMMANDS = ("status", "logs", "stop", "explain", "dump", "metrics", "rm", "wait", "adopt")


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_a_job_reference_that_is_not_utf8_names_no_job(jw: Jobwarden, command: str) -> None:
    # the bytes b"\xff\x1b]0;x\x07" as an argument: Python hands them over as surrogates, which SQLite
    # refused to encode ("internal error: UnicodeEncodeError")
    jw("run", "--name", "train", "--wait", "--", "true", check=True)
    result = jw(command, "\udcff\x1b]0;x\x07")
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("jobwarden: no job ")
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert "\x1b" not in result.stderr  # the reference is quoted, never echoed raw

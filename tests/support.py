"""What many tests share and no fixture owns: waiting on a condition with a deadline, and a component
that is missing (skipped on a developer's machine, a failure in CI)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

import pytest

IN_CI = os.environ.get("CI") == "true"
POLL_S = 0.2  # a check often runs the CLI: a process each time

T = TypeVar("T")


def unavailable(why: str) -> NoReturn:
    """A component the test needs is missing here. In CI that is a failure: scripts/test installs every
    component as root, and a test that cannot run must never pass silently."""
    if IN_CI:
        pytest.fail(f"CI must offer this: {why}")
    pytest.skip(why)


def eventually(
    what: str, check: Callable[[], T | None], timeout_s: float = 60.0, every_s: float = POLL_S
) -> T:
    """`check()`'s first truthy answer, asked until `timeout_s` passes (a deadline, never a fixed
    sleep: it returns as soon as the condition holds); the test fails naming `what` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)

"""What the hang reproducers share (test_waits*.py, test_feeds*.py): a job started with a short hang
window, the findings its status lists, and the scripts it runs, written to the test's folder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.conftest import Jobwarden
from tests.support import eventually

PY = sys.executable
HANG = ("--hang-timeout", "2s", "--on-hang", "dump")
CHAIN_S = 90.0  # the hang window, the dump and the graph, on a loaded 2-core machine


def finding(jw: Jobwarden, job: int, rule: str) -> dict[str, Any] | None:
    return next((f for f in jw.status(job)["findings"] if f["rule"] == rule), None)


def wait_chain(jw: Jobwarden, job: int) -> dict[str, Any]:
    """The job's `wait-chain` finding, once it has one."""
    return eventually("wait-chain", lambda: finding(jw, job, "wait-chain"), CHAIN_S)


def hang_findings(jw: Jobwarden, job: int) -> list[dict[str, Any]] | None:
    found = [f for f in jw.status(job)["findings"] if f["rule"] in ("wait-chain", "no-progress")]
    return found or None


def line_of(code: str, text: str) -> int:
    return next(n for n, line in enumerate(code.splitlines(), 1) if text in line)


def script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(code)
    path.chmod(0o644)
    return path

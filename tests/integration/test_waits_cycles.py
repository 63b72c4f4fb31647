"""`wait-chain` across processes: a cycle of kernel waits through different kinds of things (a pipe, a
file lock), every process and thing of it named, the process it closes on first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Jobwarden
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
PY = sys.executable
HANG = ("--hang-timeout", "2s", "--on-hang", "dump")
REFRESH = """
import fcntl, subprocess, sys

cache = open(sys.argv[1], "a")
fcntl.flock(cache, fcntl.LOCK_EX)  # held while the helper refreshes it...
# ...but the helper takes the same lock first (flock(1)), and this process reads its output meanwhile
fresh = subprocess.run(["flock", sys.argv[1], "echo", "fresh"], stdout=subprocess.PIPE).stdout
"""


def finding(jw: Jobwarden, job: int, rule: str) -> dict[str, Any] | None:
    return next((f for f in jw.status(job)["findings"] if f["rule"] == rule), None)


@pytest.mark.parametrize("launcher", ["python", "shell"])
def test_a_reader_of_a_helpers_pipe_holding_the_lock_the_helper_waits_for_is_a_deadlock(
    jw: Jobwarden, tmp_path: Path, launcher: str
) -> None:
    lock = tmp_path / "cache.lock"
    lock.touch()
    code = tmp_path / "refresh.py"
    code.write_text(REFRESH)
    if launcher == "python":
        job = jw.start(PY, str(code), str(lock), options=HANG)["id"]
    else:  # a shell script that runs it: the shell waits for it, outside the cycle
        script = tmp_path / "refresh.sh"
        script.write_text(f'{PY} {code} "$1"\necho done\n')
        job = jw.start("bash", str(script), str(lock), options=HANG)["id"]
    try:
        f = eventually("wait-chain", lambda: finding(jw, job, "wait-chain"), 90)
        processes = jw.status(job)["processes"]
        reader = next(p["pid"] for p in processes if str(code) in p["cmdline"])
        helper = next(p["pid"] for p in processes if p["cmdline"].startswith("flock "))
        assert f["pids"][0] == reader, f
        assert helper in f["pids"]
        assert f["title"] == (f"Deadlock: 2 processes wait for each other (a pipe, a file lock on {lock})"), f
        assert f"which waits for a file lock on {lock} held by pid {reader} (" in f["summary"], f
        assert "a cycle, nobody can go on (a deadlock)" in f["summary"]
    finally:
        jw("stop", str(job), check=True)

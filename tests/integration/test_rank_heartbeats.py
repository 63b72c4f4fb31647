"""Per-rank steps from each rank's own heartbeat (issue 26): two ranks of a shell-launched job, no torch and
no bar, each calling `jobwarden.heartbeat(step=...)` at its own pace. `status --json`'s `ranks` rows carry
each rank's step and rate from its own beats, where the job's heartbeat file keeps only the last rank's.

Handshake: each rank writes "ready" after its first beats; the rows are polled for with a deadline. The job
is ended by `jobwarden stop`."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.conftest import Jobwarden
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RANK = """\
import os, sys, time
import jobwarden
pause = float(sys.argv[1])
for step in range(10**9):
    jobwarden.heartbeat(step=step)
    if step == 5:
        print(f"ready {os.environ['RANK']}", flush=True)
    time.sleep(pause)
"""
# two ranks, the second four times slower; `wait` keeps the shell until both end
LAUNCH = 'RANK=0 WORLD_SIZE=2 "$1" -c "$2" 0.05 & RANK=1 WORLD_SIZE=2 "$1" -c "$2" 0.2 & wait'


def test_each_rank_reports_its_own_step_from_its_own_heartbeat(jw: Jobwarden) -> None:
    job = int(jw.start("sh", "-c", LAUNCH, "sh", sys.executable, RANK)["id"])
    try:
        eventually("both ranks ready", lambda: all(f"ready {r}" in jw.output(job) for r in (0, 1)), 60)
        rows = eventually("rank rows with steps and rates", lambda: _rated(jw, job), 60)
        by_rank = {row["rank"]: row for row in rows}
        assert set(by_rank) == {0, 1}
        assert by_rank[0]["step"] > by_rank[1]["step"] >= 5
        assert by_rank[0]["rate"] > 2 * by_rank[1]["rate"] > 0  # 20 and 5 steps a second
    finally:
        assert jw("stop", str(job), "--grace", "2s").returncode == 0


def _rated(jw: Jobwarden, job: int) -> list[dict[str, Any]] | None:
    rows = list(jw.status(job)["ranks"])
    ok = len(rows) == 2 and all(isinstance(r["step"], int) and r["rate"] for r in rows)
    return rows if ok else None

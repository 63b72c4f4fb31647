"""Time told right under a locked store (issue 20, item 9): another process holds the database's write lock
while the job ends; the end is recorded once the lock is free, with the moment it happened, not the
moment the lock was let go. Failed before its fix: the 'ended' time was the lock's release."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLI_TIMEOUT_S, Jobwarden, make_fifo, read_fifo, write_fifo

pytestmark = pytest.mark.integration
LOCK_S = 12.0  # how long the other process keeps the write lock: well under the store's busy timeout
# the job: ready, then waits for its go, notes both clocks as it ends, and exits 0
JOB = """
import json, sys, time
open(sys.argv[1], "w").write("ready\\n")
open(sys.argv[2]).read()
json.dump({"wall": time.time(), "mono": time.monotonic()}, open(sys.argv[3], "w"))
"""
# another process (a sqlite3 shell left in a transaction, a slow backup): takes the write lock, says so,
# keeps it LOCK_S (its own sleep: the fault, not a wait of the test's), lets go
LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def test_a_job_that_ends_under_a_locked_store_is_recorded_with_its_own_end(
    jw: Jobwarden, tmp_path: Path
) -> None:
    ready, go, ended = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go"), tmp_path / "ended.json"
    shared = tmp_path / "shared"
    group = ("--engine", "none", "--group", "G", "--group-dir", str(shared), "--rank", "0")
    job = jw.start(sys.executable, "-c", JOB, str(ready), str(go), str(ended), options=group)
    read_fifo(ready)
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(jw.home / "jobwarden.db"), str(LOCK_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        write_fifo(go)  # the job ends now, while the lock is held
        locker.wait(timeout=LOCK_S + CLI_TIMEOUT_S)
    finally:
        locker.kill()
        locker.wait()
        if locker.stdout is not None:
            locker.stdout.close()
    assert jw("wait", str(job["id"])).returncode == 0
    truth = json.loads(ended.read_text())
    status = jw.status(job["id"])
    lag = _seconds(status["ended_at"]) - truth["wall"]
    assert 0 <= lag < 3.0, f"the end was recorded {lag:.1f}s after it happened (the lock: {LOCK_S}s)"
    # the group record of the end: its wall and monotonic times are of the same moment, the end's
    (record,) = [
        json.loads(line)
        for line in (shared / "attempt-0" / "ranks" / "rank-0.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "ended"
    ]
    assert abs(record["died_at"] - truth["wall"]) < 3.0
    assert abs(record["mono"] - (record["wall"] - truth["wall"]) - truth["mono"]) < 3.0


def _seconds(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

"""Group records and `explain --group` with real processes and no engine: two "nodes" are two homes
(JOBWARDEN_HOME) whose runs share one --group-dir, as two machines share a file system."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.store import Store
from tests.conftest import CLI_TIMEOUT_S, Jobwarden, processes_under, wait_pid_gone

pytestmark = pytest.mark.integration
PY = sys.executable
# 1 MiB every 10 ms: past the limit in about a second, as a training step would be, not within the first
# milliseconds (an OOM kill before the shim reads the cgroup's counters is counted as theirs: see the report)
HOG = "import time\nkeep = []\nwhile True:\n    keep.append(b'x' * (1 << 20))\n    time.sleep(0.01)\n"
# waits at a "barrier" (a file the peer would create) that never opens: quiet, no CPU, then judged hung
BARRIER = "import pathlib, sys, time\nprint('at the barrier', flush=True)\n" + (
    "while not pathlib.Path(sys.argv[1]).exists():\n    time.sleep(0.2)\n"
)


@pytest.fixture
def node2(tmp_path: Path) -> Iterator[Jobwarden]:
    """A second machine: its own home, the same group dir."""
    runner = Jobwarden(tmp_path / "home2", tmp_path)
    yield runner
    leaked = processes_under(runner.home)
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in leaked:
        wait_pid_gone(pid)
    assert not leaked, f"the test left processes running: {leaked}"


def in_group(group_dir: Path, rank: int | None = 0) -> list[str]:
    """`run`'s flags of one rank of group G, outside any engine (None: no --rank)."""
    rank_args = ["--rank", str(rank)] if rank is not None else []
    return ["--engine", "none", "--group", "G", "--group-dir", str(group_dir), *rank_args]


def rank_run(node: Jobwarden, group_dir: Path, rank: int | None, *args: str) -> subprocess.Popen[str]:
    """`jobwarden run --wait` of one rank, started in the background like an srun task."""
    return subprocess.Popen(
        [PY, "-m", "jobwarden", "run", "--wait", *in_group(group_dir, rank), *args],
        env=node.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def finish(proc: subprocess.Popen[str]) -> int:
    proc.communicate(timeout=CLI_TIMEOUT_S)
    return proc.returncode


def explain(node: Jobwarden, group_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return node("explain", "--group", "G", "--group-dir", str(group_dir), *extra)


def test_an_oom_killed_rank_is_the_root_and_its_hung_peer_collateral(
    jw: Jobwarden, node2: Jobwarden, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    hung = rank_run(
        jw,
        shared,
        0,
        "--hang-timeout",
        "2s",
        "--on-hang",
        "stop",
        "--grace",
        "1s",
        "--requeue-exit",
        "200",
        "--",
        PY,
        "-c",
        BARRIER,
        str(tmp_path / "never"),
    )
    oom = rank_run(node2, shared, 1, "--mem-limit", "64M", "--requeue-exit", "200", "--", PY, "-c", HOG)
    try:
        assert finish(oom) == 128 + signal.SIGKILL  # an OOM never asks for a requeue
    finally:
        assert finish(hung) != 200
    verdict = json.loads(explain(jw, shared, "--json").stdout)
    assert verdict["state"] == "failed"
    assert (verdict["root_cause"]["rank"], verdict["root_cause"]["rule"]) == (1, "oom-kill")
    assert {r["rank"]: r["role"] for r in verdict["ranks"]} == {0: "collateral", 1: "root"}
    text = explain(node2, shared)
    assert text.returncode == 0
    assert "rank 1 on node" in text.stdout.splitlines()[0] and "OOM-killed" in text.stdout.splitlines()[0]
    assert "rank 0 then hung" in text.stdout.splitlines()[0]
    assert explain(jw, shared, "--exit-status").returncode == 1
    files = sorted(p.name for p in (shared / "attempt-0" / "ranks").iterdir())
    assert files == ["rank-0.jsonl", "rank-1.jsonl"]
    assert list((shared / "attempt-0" / "stacks").iterdir())  # the hung rank's stacks, as a document
    assert json.loads((shared / "attempt-0" / "group.json").read_text())["requeue_exit"] == 200


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_an_unwritable_group_dir_never_breaks_the_job(jw: Jobwarden, tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    group_dir = blocker / "groups" if where == "under-a-file" else Path("/proc/jobwarden-no-such-dir")
    done = jw("run", "--wait", *in_group(group_dir), "--", PY, "-c", "print('trained')")
    assert done.returncode == 0, done.stderr
    job = int(done.stdout.split()[0])
    assert jw.output(job) == "trained\n"
    with Store(jw.home) as store:
        events = [e for e in store.events(job) if e.kind == "group-unwritable"]
    assert len(events) == 1 and str(group_dir) in str(events[0].data["error"])  # said once, not per record
    assert "group records not written" in jw("status", str(job)).stdout


def test_exit_status_and_the_requeue_code(jw: Jobwarden, tmp_path: Path) -> None:
    def run(group: str, *args: str) -> tuple[int, int]:
        shared = tmp_path / group
        proc = jw("run", "--wait", *in_group(shared), "--requeue-exit", "200", *args)
        return proc.returncode, explain(jw, shared, "--exit-status").returncode

    assert run("killed", "--max-requeues", "2", "--", "sh", "-c", "kill -9 $$") == (200, 200)
    assert run("spent", "--max-requeues", "0", "--", "sh", "-c", "kill -9 $$") == (137, 1)
    assert run("raised", "--", PY, "-c", "raise SystemExit('bad config')") == (1, 1)
    assert run("ok", "--", PY, "-c", "pass") == (0, 0)
    # a writer that died mid-line: the reader skips the torn line and still answers
    with open(tmp_path / "ok" / "attempt-0" / "ranks" / "rank-0.jsonl", "a") as fh:
        fh.write('{"v":1,"kind":"alive","group":"G","att')
    verdict = json.loads(explain(jw, tmp_path / "ok", "--json").stdout)
    assert (verdict["state"], verdict["torn_lines"]) == ("succeeded", 1)


LAUNCHER = """
import os, signal, subprocess, sys, pathlib
flag = pathlib.Path(sys.argv[1])
rank0 = ("import pathlib, sys, time\\npathlib.Path(sys.argv[1]).touch()\\n"
         "while True:\\n    time.sleep(0.2)\\n")
rank1 = ("import pathlib, sys, time\\nwhile not pathlib.Path(sys.argv[1]).exists():\\n    time.sleep(0.05)\\n"
         "raise RuntimeError('bad shard 7')\\n")
procs = [subprocess.Popen([sys.executable, "-c", code, str(flag)], env={**os.environ, "RANK": str(r),
         "LOCAL_RANK": str(r)}) for r, code in enumerate((rank0, rank1))]
procs[1].wait()
procs[0].send_signal(signal.SIGTERM)  # torchrun's teardown after a failed worker
procs[0].wait()
sys.exit(1)
"""


def test_under_a_launcher_each_rank_gets_its_own_file_and_end(jw: Jobwarden, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    node = rank_run(jw, shared, None, "--", PY, "-c", LAUNCHER, str(tmp_path / "rank0-up"))
    assert finish(node) == 1
    files = {p.name for p in (shared / "attempt-0" / "ranks").iterdir()}
    # the node's own file holds what came before the first rank appeared (an `alive`), if anything did
    assert files - {"node-" + os.uname().nodename.split(".")[0] + ".jsonl"} == {
        "rank-0.jsonl",
        "rank-1.jsonl",
    }
    verdict = json.loads(explain(jw, shared, "--json").stdout)
    assert (verdict["root_cause"]["rank"], verdict["root_cause"]["rule"]) == (1, "python-exception")
    assert {r["rank"]: r["role"] for r in verdict["ranks"]} == {0: "collateral", 1: "root"}

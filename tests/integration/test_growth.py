"""Nothing grows without bound (issue 20, item 8): the hooks' files of ended processes are pruned, `logs
--since` streams, a malformed sample row is skipped and counted. Each test here failed before its fix."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLI_TIMEOUT_S, Jobwarden, make_fifo, read_fifo, write_fifo
from tests.support import eventually

pytestmark = pytest.mark.integration
FORKS = 400
# forks FORKS short-lived Python children (each one hooked: its advert and faulthandler file), one of which
# dies of an uncaught exception, says so, and waits
FORKER = f"""
import os, sys
for i in range({FORKS}):
    pid = os.fork()
    if pid == 0:
        if i == 7:
            raise ValueError("child 7 kept its exception")
        os._exit(0)
    os.waitpid(pid, 0)
open(sys.argv[1], "w").write("forked\\n")
open(sys.argv[2]).read()
"""


def hook_files(py_dir: Path) -> list[str]:
    """The adverts (and faulthandler files, where no memfd): one a process, as the hooks start in it."""
    names = (p.name for p in py_dir.iterdir())
    return sorted(n for n in names if n.endswith((".stacks", ".json")) and not n.endswith(".exc.json"))


def test_the_hooks_files_of_ended_processes_are_pruned(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, "-c", FORKER, str(ready), str(go))
    read_fifo(ready)
    py_dir = jw.home / "jobs" / str(job["id"]) / "run-1" / "py"
    main = str(job["pid"])
    try:
        # the shim prunes at its full scans (every 10 s): within a deadline only the live main process's
        eventually(  # faulthandler's file is a memfd
            "only the main process's hook files left",
            lambda: hook_files(py_dir) == [f"{main}.json"],
            60,
            every_s=0.2,
        )
    finally:
        write_fifo(go)
    assert jw("wait", str(job["id"])).returncode == 0
    assert hook_files(py_dir) == [], "the main process's files outlived it"
    kept = [p.name for p in py_dir.iterdir() if p.name.endswith(".exc.json")]
    assert len(kept) == 1 and "child 7 kept" in (py_dir / kept[0]).read_text()  # the diagnosis needs it


def test_logs_since_streams_a_large_log_in_little_memory(jw: Jobwarden) -> None:
    job = jw.start("true")
    assert jw("wait", str(job["id"])).returncode == 0
    run_dir = jw.home / "jobs" / str(job["id"]) / "run-1"
    line = b"x" * 1023 + b"\n"
    with open(run_dir / "output.log", "wb") as fh:
        for _ in range(256):  # 256 MiB
            fh.write(line * 1024)
    (run_dir / "output.idx").write_text(f"{time.time() - 3600:.3f} 0\n")
    # the CLI's peak RSS, measured by a parent of its own (RUSAGE_CHILDREN of this process counts others)
    probe = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    for args in (("--since", "2h"), ("--since", "2h", "-n", "100000"), ()):
        cli = [sys.executable, "-m", "jobwarden", "logs", *args, str(job["id"])]
        measured = subprocess.run(
            [sys.executable, "-c", probe, *cli],
            env=jw.env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        code, max_rss_kib = (int(v) for v in measured.stdout.split())
        assert code == 0, measured.stderr
        assert max_rss_kib < 120 * 1024, f"logs {' '.join(args)} held {max_rss_kib // 1024} MiB"
    tail = subprocess.run(
        [sys.executable, "-m", "jobwarden", "logs", "--since", "2h", "-n", "3", str(job["id"])],
        env=jw.env,
        capture_output=True,
        timeout=CLI_TIMEOUT_S,
    ).stdout
    assert tail == line * 3


def test_a_malformed_sample_row_is_skipped_and_counted(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    code = "import sys\nopen(sys.argv[1], 'w').write('up\\n')\nopen(sys.argv[2]).read()\n"
    job = jw.start(sys.executable, "-c", code, str(ready), str(go))
    read_fifo(ready)
    try:
        eventually("the shim's first samples", lambda: jw.json("metrics", str(job["id"])), 60, every_s=0.2)
        with sqlite3.connect(jw.home / "jobwarden.db") as db:  # SQLite keeps any value in any column
            now = time.time()
            db.execute(
                "INSERT INTO samples (job_id, run, at, nprocs, cpu_percent, rss_bytes, gpus) "
                "VALUES (?, 1, ?, 1, 'a lot', 'x', '[1')",
                (job["id"], now + 5),
            )
        db.close()
        for args in (("status",), ("metrics",), ("metrics", "--json"), ("ps",), ("metrics", "--prometheus")):
            result = jw(*args, str(job["id"])) if args != ("ps",) else jw("ps")
            assert result.returncode == 0, f"{args}: {result.stderr}"
            assert "internal error" not in result.stderr
        said = jw("metrics", str(job["id"])).stderr
        assert f"skipped 1 malformed sample row(s) of job {job['id']}" in said
        samples = json.loads(jw("metrics", "--json", str(job["id"])).stdout)
        assert samples and all(isinstance(s["cpu_percent"], float | int | None) for s in samples)
    finally:
        write_fifo(go)
    assert jw("wait", str(job["id"])).returncode == 0

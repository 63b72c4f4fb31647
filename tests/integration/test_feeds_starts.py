"""`wait-chain` through queues and events whose feeders the source starts otherwise than as
`Thread(target=...)`: a `Thread` subclass's `run`, an executor's task (probes.feedstarts); and objects
reached otherwise than by a module's name: an attribute bound once in `__init__` (`self.q`), a queue
imported from another module of the job. Each job hangs for real with a short window."""

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


def finding(jw: Jobwarden, job: int, rule: str) -> dict[str, Any] | None:
    return next((f for f in jw.status(job)["findings"] if f["rule"] == rule), None)


def line_of(code: str, text: str) -> int:
    return next(n for n, line in enumerate(code.splitlines(), 1) if text in line)


def script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(code)
    path.chmod(0o644)
    return path


SUBCLASS_RAISES = """
import queue, threading

batches = queue.Queue()


class Prefetcher(threading.Thread):
    def __init__(self, paths):
        super().__init__(daemon=True, name="prefetch")
        self.paths = paths

    def run(self):
        for path in self.paths:
            batches.put(open(path).read())


Prefetcher(["/nonexistent/shard-0"]).start()
print(batches.get())
"""


def test_a_thread_subclass_whose_run_raised_is_named_as_the_ended_feeder(
    jw: Jobwarden, tmp_path: Path
) -> None:
    train = script(tmp_path, "train.py", SUBCLASS_RAISES)
    job = jw.start(PY, str(train), options=HANG)["id"]
    try:
        f = eventually("wait-chain", lambda: finding(jw, job, "wait-chain"), 90)
        main_pid = jw.status(job)["pid"]
        assert f["pids"][0] == main_pid, f
        at = f"{train}:{line_of(SUBCLASS_RAISES, 'batches.get()')}"
        assert f["title"] == (
            f'Thread "MainThread" of pid {main_pid} waits on queue batches ({at}); the only thread that puts'
            ' into it, "prefetch", ended'
        ), f
        evidence = "\n".join(f["evidence"])
        put, made = line_of(SUBCLASS_RAISES, "batches.put"), line_of(SUBCLASS_RAISES, "Prefetcher([")
        assert f"run (line {put}), started at line {made}" in evidence, f
        assert "Exception in thread prefetch" in evidence, f
    finally:
        jw("stop", str(job), check=True)


TASK_RAISES = """
import threading
from concurrent.futures import ThreadPoolExecutor

ready = threading.Event()


def warm_cache(path):
    with open(path) as f:
        f.read()
    ready.set()


def main():
    with ThreadPoolExecutor(max_workers=2) as pool:
        pool.submit(warm_cache, "/nonexistent/cache.bin")
        ready.wait()
        print("warm")


main()
"""


def test_an_executor_task_that_raised_is_named_as_the_ended_feeder(jw: Jobwarden, tmp_path: Path) -> None:
    # the task's exception stays in its Future: the output shows nothing, the finding says where to look
    train = script(tmp_path, "warm.py", TASK_RAISES)
    job = jw.start(PY, str(train), options=HANG)["id"]
    try:
        f = eventually("wait-chain", lambda: finding(jw, job, "wait-chain"), 90)
        main_pid = jw.status(job)["pid"]
        assert f["pids"][0] == main_pid, f
        at = f"{train}:{line_of(TASK_RAISES, 'ready.wait()')}"
        submitted = line_of(TASK_RAISES, "pool.submit")
        assert f["title"] == (
            f'Thread "MainThread" of pid {main_pid} waits on event ready ({at}); the only task that sets'
            f" it (warm_cache, submitted at line {submitted}) ended"
        ), f
        assert f"warm_cache (line {line_of(TASK_RAISES, 'ready.set()')}), submitted at line {submitted}" in (
            "\n".join(f["evidence"])
        ), f
        assert "kept in its Future" in f["remedy"], f
    finally:
        jw("stop", str(job), check=True)

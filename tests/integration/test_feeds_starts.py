"""`wait-chain` through queues and events whose feeders the source starts otherwise than as
`Thread(target=...)`: a `Thread` subclass's `run`, an executor's task (probes.feedstarts); and objects
reached otherwise than by a module's name: an attribute bound once in `__init__` (`self.q`), a queue
imported from another module of the job. Each job hangs for real with a short window."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.integration.hangcases import HANG, PY, line_of, script, wait_chain

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


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
        f = wait_chain(jw, job)
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
        f = wait_chain(jw, job)
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


ATTRIBUTE_QUEUE = """
import queue, threading


class ShardReader:
    def __init__(self, paths):
        self.paths = paths
        self.ready = queue.Queue(maxsize=4)
        self.worker = threading.Thread(target=self.prefetch, name="shard-prefetch", daemon=True)

    def prefetch(self):
        for path in self.paths:
            with open(path, "rb") as f:
                self.ready.put(f.read())

    def __iter__(self):
        self.worker.start()
        for _ in self.paths:
            yield self.ready.get()


for shard in ShardReader(["/nonexistent/shard-0", "/nonexistent/shard-1"]):
    print(len(shard))
"""


def test_a_queue_bound_to_self_in_init_names_the_method_thread_that_ended(
    jw: Jobwarden, tmp_path: Path
) -> None:
    train = script(tmp_path, "shards.py", ATTRIBUTE_QUEUE)
    job = jw.start(PY, str(train), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        main_pid = jw.status(job)["pid"]
        assert f["pids"][0] == main_pid, f
        at = f"{train}:{line_of(ATTRIBUTE_QUEUE, 'yield self.ready.get()')}"
        assert f["title"] == (
            f'Thread "MainThread" of pid {main_pid} waits on queue self.ready ({at}); the only thread that'
            ' puts into it, "shard-prefetch", ended'
        ), f
        assert "Exception in thread shard-prefetch" in "\n".join(f["evidence"]), f
    finally:
        jw("stop", str(job), check=True)


JOBQUEUE = """
import queue, sys, threading

work_queue = queue.Queue()


def read_requests():
    for line in sys.stdin:
        work_queue.put(line.strip())


def start_reader():
    threading.Thread(target=read_requests, name="stdin-reader", daemon=True).start()
"""
SERVE = """
from jobqueue import start_reader, work_queue

start_reader()
while True:
    request = work_queue.get()
    print("serving", request)
"""


def test_a_queue_imported_from_the_jobs_own_module_names_its_feeder_and_the_pipes_writer(
    jw: Jobwarden, tmp_path: Path
) -> None:
    # launched by a shell pipeline: the feeder in jobqueue.py reads stdin, which `tail -f` never closes
    script(tmp_path, "jobqueue.py", JOBQUEUE)
    serve = script(tmp_path, "serve.py", SERVE)
    pipeline = script(tmp_path, "serve.sh", f"cd {tmp_path}\ntail -f /dev/null | {PY} serve.py\n")
    job = jw.start("bash", str(pipeline), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        processes = jw.status(job)["processes"]
        tail = next(p["pid"] for p in processes if p["cmdline"].startswith("tail -f"))
        python = next(p["pid"] for p in processes if "serve.py" in p["cmdline"])
        assert f["pids"][0] == tail, f
        assert python in f["pids"], f
        at = f"{serve}:{line_of(SERVE, 'work_queue.get()')}"
        assert f["title"] == (
            f'Thread "MainThread" of pid {python} waits on queue work_queue ({at}), fed by thread'
            f' "stdin-reader" of pid {python}, which reads a pipe whose write end pid {tail} still holds open'
        ), f
        evidence = "\n".join(f["evidence"])
        assert f"made at {tmp_path}/jobqueue.py:{line_of(JOBQUEUE, 'work_queue = ')}" in evidence, f
        assert f"read_requests ({tmp_path}/jobqueue.py:{line_of(JOBQUEUE, 'work_queue.put')})" in evidence, f
    finally:
        jw("stop", str(job), check=True)

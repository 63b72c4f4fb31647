"""`wait-chain` through queues, events and conditions (probes.feeds, rules.hang.feeds): a thread waits
on an object the job's source names, and the finding says who would feed it and what became of them (a
thread that ended, a process that died, a feeder itself blocked on a pipe, a cycle). Each job hangs for
real with a short window; the healthy jobs wait on purpose and get no more than `no-progress`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.integration.hangcases import HANG, PY, finding, hang_findings, line_of, script, wait_chain
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


LOADER_RAISES = """
import queue, threading

results = queue.Queue()


def load():
    for name in ["a.csv", "b.csv"]:
        rows = open("/nonexistent/" + name).read()
        results.put(rows)


threading.Thread(target=load, name="loader").start()
for _ in range(2):
    print(results.get())
"""


def test_a_consumer_whose_only_producer_thread_ended_names_the_queue_and_the_thread(
    jw: Jobwarden, tmp_path: Path
) -> None:
    train = script(tmp_path, "train.py", LOADER_RAISES)
    job = jw.start(PY, str(train), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        main_pid = jw.status(job)["pid"]
        assert f["pids"][0] == main_pid, f
        at = f"{train}:{line_of(LOADER_RAISES, 'results.get()')}"
        assert f["title"] == (
            f'Thread "MainThread" of pid {main_pid} waits on queue results ({at}); the only thread that puts'
            ' into it, "loader", ended'
        ), f
        evidence = "\n".join(f["evidence"])
        put, start = line_of(LOADER_RAISES, "results.put"), line_of(LOADER_RAISES, "threading.Thread")
        assert f"load (line {put}), started at line {start}" in evidence, f
        assert "Exception in thread loader" in evidence, f
        assert finding(jw, job, "no-progress") is None
    finally:
        jw("stop", str(job), check=True)


READER_FEEDS_THE_EVENT = """
import sys, threading

ready = threading.Event()
lines = []


def read_header():
    lines.append(sys.stdin.readline())
    lines.extend(sys.stdin)
    ready.set()


threading.Thread(target=read_header, name="header").start()
ready.wait()
print(lines)
"""


def test_an_event_whose_setter_reads_a_pipe_nobody_writes_names_the_pipes_writer(
    jw: Jobwarden, tmp_path: Path
) -> None:
    # a shell pipeline: the thread that sets the event reads stdin, fed by `tail -f` that never ends
    consumer = script(tmp_path, "consume.py", READER_FEEDS_THE_EVENT)
    pipeline = script(tmp_path, "pipeline.sh", f"tail -f /dev/null | {PY} {consumer}\n")
    job = jw.start("bash", str(pipeline), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        processes = jw.status(job)["processes"]
        tail = next(p["pid"] for p in processes if p["cmdline"].startswith("tail -f"))
        python = next(p["pid"] for p in processes if str(consumer) in p["cmdline"])
        assert f["pids"][0] == tail, f
        assert python in f["pids"]
        at = f"{consumer}:{line_of(READER_FEEDS_THE_EVENT, 'ready.wait()')}"
        assert f["title"] == (
            f'Thread "MainThread" of pid {python} waits on event ready ({at}), set by thread'
            f' "header" of pid {python}, which reads a pipe whose write end pid {tail} still holds open'
        ), f
    finally:
        jw("stop", str(job), check=True)


PRODUCER_PROCESS_DIES = """
import multiprocessing as mp
import os
import signal


def produce(out):
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    out.put("batch")


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    batches = ctx.Queue()
    producer = ctx.Process(target=produce, args=(batches,))
    producer.start()
    print(batches.get())
"""


def test_a_multiprocessing_queue_whose_producer_process_died_names_the_dead_producer(
    jw: Jobwarden, tmp_path: Path
) -> None:
    train = script(tmp_path, "train.py", PRODUCER_PROCESS_DIES)
    job = jw.start(PY, str(train), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        main_pid = jw.status(job)["pid"]
        assert len(f["pids"]) >= 2 and f["pids"][1] == main_pid, f
        dead = f["pids"][0]
        at = f"{train}:{line_of(PRODUCER_PROCESS_DIES, 'batches.get()')}"
        assert f["title"] == (
            f'Thread "MainThread" of pid {main_pid} waits on multiprocessing queue batches ({at});'
            f" the process that puts into it, pid {dead}, died (killed by SIGKILL)"
        ), f
        evidence = f["evidence"]
        said = [e for e in evidence if e.startswith(f"pid {dead} (")]
        assert said and said[0].endswith("died (killed by SIGKILL)"), evidence
    finally:
        jw("stop", str(job), check=True)


TWO_QUEUES = """
import queue, threading

asks = queue.Queue()
answers = queue.Queue()


def serve():
    while True:
        question = asks.get()
        answers.put(question * 2)


def ask():
    answer = answers.get()  # waits for the answer before asking: nobody asks, nobody answers
    asks.put(answer)


server = threading.Thread(target=serve, name="server")
client = threading.Thread(target=ask, name="client")
server.start()
client.start()
client.join()
"""


def test_two_threads_each_waiting_for_what_the_other_feeds_are_a_deadlock(
    jw: Jobwarden, tmp_path: Path
) -> None:
    code = script(tmp_path, "pingpong.py", TWO_QUEUES)
    job = jw.start(PY, "-X", "dev", str(code), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        main_pid = jw.status(job)["pid"]
        assert f["pids"][0] == main_pid, f
        assert f["title"] in (
            f"Deadlock: 2 threads of pid {main_pid} wait for each other (queue asks, queue answers)",
            f"Deadlock: 2 threads of pid {main_pid} wait for each other (queue answers, queue asks)",
        ), f
        assert 'thread "server" of pid' in f["summary"] and 'thread "client" of pid' in f["summary"], f
    finally:
        jw("stop", str(job), check=True)


IDLE_POOL = """
import queue, threading, time

tasks = queue.Queue()
stop = threading.Event()


def work():
    while True:
        task = tasks.get()
        print("did", task, flush=True)


def serve():
    stop.wait()


for n in range(3):
    threading.Thread(target=work, name=f"worker-{n}", daemon=True).start()
threading.Thread(target=serve, name="server").start()
while True:
    time.sleep(3600)  # polls for work now and then: puts into the task queue, or sets stop
    tasks.put("poll")
    stop.set()
"""


def test_a_pool_idling_on_its_task_queue_and_a_server_on_its_stop_event_are_no_wait_chain(
    jw: Jobwarden, tmp_path: Path
) -> None:
    code = script(tmp_path, "idle.py", IDLE_POOL)
    job = jw.start(PY, str(code), options=HANG)["id"]
    try:
        found = eventually("a hang finding", lambda: hang_findings(jw, job), 90)
        assert [f["rule"] for f in found] == ["no-progress"], found
    finally:
        jw("stop", str(job), check=True)


SLOW_PRODUCER = """
import multiprocessing as mp
import time


def produce(out):
    while True:
        time.sleep(3600)  # a slow source: the next item comes in an hour
        out.put("item")


if __name__ == "__main__":
    items = mp.Queue()
    mp.Process(target=produce, args=(items,)).start()
    while True:
        print(items.get(), flush=True)
"""


def test_a_multiprocessing_consumer_of_a_live_sleeping_producer_is_no_wait_chain(
    jw: Jobwarden, tmp_path: Path
) -> None:
    code = script(tmp_path, "slow.py", SLOW_PRODUCER)
    job = jw.start(PY, str(code), options=HANG)["id"]
    try:
        found = eventually("a hang finding", lambda: hang_findings(jw, job), 90)
        assert [f["rule"] for f in found] == ["no-progress"], found
    finally:
        jw("stop", str(job), check=True)

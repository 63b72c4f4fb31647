"""What the source says a waiting thread waits on and who feeds it (probes.feeds), and where the rule
ends the chain (rules.hang.feeds): only where nothing can feed it any more, never while a feeder lives."""

from __future__ import annotations

import dataclasses

from jobwarden.observations import Frame, ProcessDeath, ProcessStack, ThreadStack, Wait
from jobwarden.probes.feeds import sites_in, waiting_call
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.hang.feeds import FeedGraph

F = "/job/train.py"
SOURCE = b"""import queue, threading
import multiprocessing as mp
from queue import Queue

results = queue.Queue()
ready = threading.Event()
handed = Queue()
leaked = queue.Queue()


def load():
    results.put(1)


def fill(out):
    out.put(2)


def main():
    threading.Thread(target=load, name="loader").start()
    threading.Thread(target=fill, args=(handed,)).start()
    ctx = mp.get_context("spawn")
    batches = ctx.Queue()
    register(leaked)
    results.get()
    ready.wait()
    handed.get()
    leaked.get()
    results.get(timeout=5)
    batches.get()
    ctx.Process(target=produce, args=(batches,)).start()


def produce(q):
    q.put(3)
"""


def line(text: str) -> int:
    return next(n for n, t in enumerate(SOURCE.decode().splitlines(), 1) if t.strip() == text)


def site(text: str):  # type: ignore[no-untyped-def]
    found = sites_in(SOURCE, F, [line(text)])
    return found[0] if found else None


def test_a_queue_made_at_module_level_is_named_with_the_thread_that_feeds_it() -> None:
    s = site("results.get()")
    assert s is not None and (s.name, s.kind, s.across, s.defined) == ("results", "queue", "threads", 5)
    assert s.feeders is not None and [f.function for f in s.feeders] == ["load"]
    (start,) = s.feeders[0].starts
    assert (start.kind, start.name, start.scope, start.line) == ("thread", "loader", "main", 20)
    assert s.feeders[0].only_started


def test_an_event_nothing_sets_has_no_feeders_and_a_handed_queue_is_fed_through_the_parameter() -> None:
    ready = site("ready.wait()")
    assert ready is not None and ready.feeders == ()
    handed = site("handed.get()")
    assert handed is not None and handed.feeders is not None
    assert [(f.function, f.line) for f in handed.feeders] == [("fill", 16)]


def test_a_queue_handed_to_other_code_has_unknown_feeders_and_a_timed_wait_is_no_site() -> None:
    leaked = site("leaked.get()")
    assert leaked is not None and leaked.feeders is None  # register() may put into it
    assert site("results.get(timeout=5)") is None


def test_a_context_queue_is_a_multiprocessing_one() -> None:
    s = site("batches.get()")
    assert s is not None and (s.kind, s.across) == ("queue", "processes")
    assert s.feeders is not None and [(f.function, f.starts[0].kind) for f in s.feeders] == [
        ("produce", "process")
    ]


def test_the_call_that_waits_is_the_first_frame_out_of_the_librarys_waits() -> None:
    frames = (
        Frame("wait", "/usr/lib/python3.11/threading.py", 327),
        Frame("get", "/usr/lib/python3.11/queue.py", 171),
        Frame("main", F, 24),
    )
    assert waiting_call(frames) == frames[2]
    assert waiting_call(frames[2:]) is None  # not in a library wait: no queue to read


# --- the rule ---------------------------------------------------------------------------------------

MAIN = 100
T = "/usr/lib/python3.11/threading.py"
Q = "/usr/lib/python3.11/queue.py"


def waiter() -> ThreadStack:
    frames = (Frame("wait", T, 327), Frame("Queue.get", Q, 171), Frame("main", F, line("results.get()")))
    return ThreadStack(MAIN, "MainThread", frames, "S", active=False)


def hung(*threads: ThreadStack) -> RunEvidence:
    return RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=MAIN,
        hang_window_s=60.0,
        quiet_for_s=60.0,
        stacks=(ProcessStack(MAIN, "py-spy", threads),),
        feed_sites={(F, line("results.get()")): site("results.get()")},
    )


def test_a_consumer_whose_feeder_thread_is_gone_is_a_wait_chain_naming_the_thread() -> None:
    first = explain(hung(waiter()))[0]
    assert first.rule == "wait-chain" and first.pids == (MAIN,)
    assert first.title.endswith(
        'waits on queue results (/job/train.py:25); the only thread that puts into it, "loader", ended'
    )


def test_no_finding_while_a_feeder_runs_or_a_thread_could_start_one() -> None:
    feeding = ThreadStack(101, "loader", (Frame("load", F, 12),), "R", active=True)
    assert "wait-chain" not in [f.rule for f in explain(hung(waiter(), feeding))]
    starter = ThreadStack(102, "other", (Frame("sleep", T, 1), Frame("main", F, 20)), "S", active=False)
    assert "wait-chain" not in [f.rule for f in explain(hung(waiter(), starter))]


def test_a_dead_child_is_the_producer_of_a_multiprocessing_queue() -> None:
    s = site("batches.get()")
    assert s is not None
    graph = FeedGraph(
        [ProcessStack(MAIN, "py-spy", (waiter(),))],
        {(F, line("results.get()")): s},
        [],
        [ProcessDeath(200, MAIN, "python -c spawn_main", 1.0, None, "SIGKILL")],
    )
    chain = graph.follow(MAIN)
    assert chain is not None and chain.end == "died" and [d.pid for d in chain.dead] == [200]
    alive = ProcessStack(
        200,
        "py-spy",
        (ThreadStack(200, "MainThread", (Frame("produce", F, line("q.put(3)")),), "S", active=False),),
    )
    graph.stacks[200] = alive
    assert graph.follow(MAIN) is None  # a live producer, idle in a sleep: it may put yet


def test_a_feeder_whose_own_wait_explains_nothing_leaves_the_kernels_chain_to_speak() -> None:
    # thread 102 feeds the queue and waits for a child stuck on a futex (nothing said of it); thread 101
    # waits for a lock another user holds: that chain is the finding, as it was before queues were read
    feeder = ThreadStack(102, "loader", (Frame("load", F, 12),), "S", active=False)
    locked = ThreadStack(101, "locker", (Frame("flock", "/usr/lib/python3.11/x.py", 1),), "S", active=False)
    ev = dataclasses.replace(
        hung(waiter(), locked, feeder),
        waits=(
            Wait(MAIN, 101, "file-lock", "flock", "/data/cache.lock", (777,)),
            Wait(MAIN, 102, "child", "wait4", "child pid 200", (200,)),
        ),
    )
    first = explain(ev)[0]
    assert first.rule == "wait-chain" and first.pids[0] == 777
    assert first.title == "Waits for a file lock on /data/cache.lock held by pid 777"


def test_names_defined_by_each_others_calls_end_the_reading_without_an_error() -> None:
    looped = b"import queue\na = b.get_context()\nb = a.make()\nq = a.Queue()\nq.get()\n"
    assert sites_in(looped, F, [5]) == []

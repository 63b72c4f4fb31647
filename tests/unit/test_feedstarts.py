"""Feeders started otherwise than as `Thread(target=...)` (probes.feedstarts through probes.feeds): a
`Thread` subclass's `run`, an executor's task, a bound method as a target; and what the text must not
let through (a `run` also called directly, a task handed its queue through `*args`)."""

from __future__ import annotations

from jobwarden.observations import FeedSite
from jobwarden.probes.feeds import sites_in

F = "/job/train.py"
SOURCE = b"""import queue, threading
from concurrent.futures import ThreadPoolExecutor

results = queue.Queue()
done = threading.Event()
parts = queue.Queue()
rows = queue.Queue()
called = queue.Queue()


class Loader(threading.Thread):
    def run(self):
        results.put(1)


class Closer(threading.Thread):
    def run(self):
        done.set()


def load_part(out, n):
    out.put(n)


def spread(*args):
    pass


class Feeder:
    def fill(self):
        rows.put(1)

    def start(self):
        threading.Thread(target=self.fill, name="filler").start()


class Direct(threading.Thread):
    def run(self):
        called.put(1)


def main():
    Loader(name="loader").start()
    Closer().start()
    with ThreadPoolExecutor(2) as pool:
        pool.submit(load_part, parts, 1)
        results.get()
        done.wait()
        parts.get()
        rows.get()
        called.get()
    Direct().run()
"""


def site(text: str) -> FeedSite:
    line = next(n for n, t in enumerate(SOURCE.decode().splitlines(), 1) if t.strip() == text)
    (found,) = sites_in(SOURCE, F, [line])
    return found


def test_a_thread_subclass_feeds_from_its_run_started_where_the_class_is_made() -> None:
    s = site("results.get()")
    assert s.feeders is not None and [f.function for f in s.feeders] == ["run"]
    (start,) = s.feeders[0].starts
    assert (start.kind, start.name, start.scope) == ("thread", "loader", "main")
    assert s.feeders[0].only_started
    closer = site("done.wait()")
    assert closer.feeders is not None and [(f.function, len(f.starts)) for f in closer.feeders] == [
        ("run", 1)
    ]


def test_an_executors_task_feeds_the_queue_handed_to_it_by_submit() -> None:
    s = site("parts.get()")
    assert s.feeders is not None and [f.function for f in s.feeders] == ["load_part"]
    (start,) = s.feeders[0].starts
    assert (start.kind, start.scope) == ("task", "main")
    assert s.feeders[0].only_started


def test_a_bound_method_as_a_target_feeds() -> None:
    s = site("rows.get()")
    assert s.feeders is not None and [f.function for f in s.feeders] == ["fill"]
    assert [(st.kind, st.name) for st in s.feeders[0].starts] == [("thread", "filler")]
    assert s.feeders[0].only_started


def test_a_run_also_called_directly_is_not_only_started() -> None:
    s = site("called.get()")
    assert s.feeders is not None and not s.feeders[0].only_started  # `Direct().run()`: no thread needed


def test_a_queue_handed_through_star_args_is_unknown() -> None:
    source = SOURCE.replace(b"pool.submit(load_part, parts, 1)", b"pool.submit(spread, *[parts])")
    line = next(n for n, t in enumerate(source.decode().splitlines(), 1) if t.strip() == "parts.get()")
    (found,) = sites_in(source, F, [line])
    assert found.feeders is None


def test_a_thread_class_handed_elsewhere_may_be_made_there() -> None:
    source = SOURCE + b"\nregistry = [Loader]\n"
    line = next(n for n, t in enumerate(source.decode().splitlines(), 1) if t.strip() == "results.get()")
    (found,) = sites_in(source, F, [line])
    assert found.feeders is not None and not found.feeders[0].only_started

"""Objects probes.feeds reaches otherwise than by a name the file binds: an attribute bound once in a
class's `__init__` (`self.q`), used in that class's methods; a queue imported from another module of the
job, whose feeders may be in either file."""

from __future__ import annotations

from pathlib import Path

from jobwarden.observations import FeedSite
from jobwarden.probes.feeds import sites_in

F = "/job/pipeline.py"
PIPELINE = b"""import queue, threading


class Pipeline:
    def __init__(self, paths):
        self.paths = paths
        self.q = queue.Queue()
        self.loader = threading.Thread(target=self.load, name="loader")

    def load(self):
        for path in self.paths:
            self.q.put(open(path).read())

    def consume(self):
        return self.q.get()


class Leaky:
    def __init__(self):
        self.out = queue.Queue()

    def drain(self):
        return self.out.get()


class Handed:
    def __init__(self):
        self.jobs = queue.Queue()
        threading.Thread(target=fill, args=(self.jobs,)).start()

    def next(self):
        return self.jobs.get()


def fill(jobs):
    jobs.put(1)


leaky = Leaky()
leaky.out.put(1)
"""


def site(source: bytes, text: str) -> FeedSite | None:
    line = next(n for n, t in enumerate(source.decode().splitlines(), 1) if t.strip() == text)
    found = sites_in(source, F, [line])
    return found[0] if found else None


def test_an_attribute_bound_once_in_init_is_fed_by_the_methods_that_put_into_it() -> None:
    s = site(PIPELINE, "return self.q.get()")
    assert s is not None and (s.name, s.kind, s.defined) == ("self.q", "queue", 7)
    assert s.feeders is not None and [f.function for f in s.feeders] == ["load"]
    assert [(st.kind, st.name) for st in s.feeders[0].starts] == [("thread", "loader")]
    assert s.feeders[0].only_started


def test_an_attribute_handed_to_a_thread_is_fed_through_the_parameter() -> None:
    s = site(PIPELINE, "return self.jobs.get()")
    assert s is not None and s.feeders is not None and [f.function for f in s.feeders] == ["fill"]


def test_an_attribute_named_on_another_object_has_unknown_feeders() -> None:
    s = site(PIPELINE, "return self.out.get()")
    assert s is not None and s.feeders is None  # `leaky.out.put(1)`: the text cannot tell which object


def test_an_attribute_bound_twice_or_by_setattr_is_no_object() -> None:
    twice = PIPELINE.replace(
        b"        self.paths = paths\n", b"        self.paths = paths\n        self.q = None\n"
    )
    assert site(twice, "return self.q.get()") is None
    assert site(PIPELINE + b"setattr(leaky, name, 1)\n", "return self.q.get()") is None


JOBQUEUE = b"""import queue

work_queue = queue.Queue()


def submit(item):
    work_queue.put(item)
"""
TRAIN = b"""import threading
from jobqueue import work_queue as work
from jobqueue import submit


def produce():
    submit(1)


def report():
    work.put(None)


threading.Thread(target=report, name="reporter").start()
work.get()
"""


def imported_site(tmp_path: Path, train: bytes = TRAIN) -> FeedSite | None:
    (tmp_path / "jobqueue.py").write_bytes(JOBQUEUE)
    (tmp_path / "train.py").write_bytes(train)
    line = next(n for n, t in enumerate(train.decode().splitlines(), 1) if t.strip() == "work.get()")
    found = sites_in(train, str(tmp_path / "train.py"), [line], lambda p: Path(p).read_bytes())
    return found[0] if found else None


def test_a_queue_imported_from_a_module_beside_is_fed_by_both_files(tmp_path: Path) -> None:
    s = imported_site(tmp_path)
    assert s is not None and (s.name, s.kind, s.defined, s.made_in) == (
        "work",
        "queue",
        3,
        str(tmp_path / "jobqueue.py"),
    )
    assert s.feeders is not None
    assert [(f.function, f.file) for f in s.feeders] == [
        ("report", ""),
        ("submit", str(tmp_path / "jobqueue.py")),
    ]
    assert [(st.kind, st.name) for st in s.feeders[0].starts] == [("thread", "reporter")]


def test_another_file_beside_that_names_the_queue_leaves_its_feeders_unknown(tmp_path: Path) -> None:
    (tmp_path / "other.py").write_text("from jobqueue import work_queue\nwork_queue.put(2)\n")
    s = imported_site(tmp_path)
    assert s is not None and s.feeders is None


def test_an_import_of_a_module_not_beside_or_without_the_object_is_no_site(tmp_path: Path) -> None:
    assert (
        imported_site(tmp_path, TRAIN.replace(b"from jobqueue import work_queue", b"from elsewhere import q"))
        is None
    )
    source = TRAIN.replace(b"work_queue as work", b"submit as work")
    assert imported_site(tmp_path, source) is None  # a function, not a queue

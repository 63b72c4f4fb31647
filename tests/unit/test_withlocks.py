"""Python lock cycles from stacks and source: which `with` locks a line takes and holds (probes.withlocks),
and the threads that wait for each other's (rules.hang.lockcycle, through wait-chain)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobwarden.observations import Frame, HeldLock, LockSite, ProcessStack, ThreadStack
from jobwarden.probes.pysource import source_of
from jobwarden.probes.withlocks import lock_sites, sites_in, wanting_owners
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.hang.lockcycle import lock_cycles

SOURCE = b"""\
import threading
from threading import RLock

a = threading.Lock()
b = RLock()
rebound = threading.Lock()
rebound = threading.Lock()
shadowed = threading.Lock()


def forwards():
    with a:
        step()
        with b:
            pass


def local_lock(shadowed):
    with shadowed:
        pass


def pair():
    with a, b:
        pass


class Cache:
    def __init__(self):
        self._lock = threading.Lock()

    def get(self):
        with self._lock, rebound:
            pass


with b:
    ready = True

    def later():
        with a:
            pass


def by_hand():
    with a:
        b.acquire()
        b.acquire(timeout=5)
        shadowed.acquire(); ready = False
"""
F = "/src/app.py"


def site(line: int) -> LockSite | None:
    return next(iter(sites_in(SOURCE, F, [line])), None)


def test_a_with_line_takes_its_lock_and_lines_inside_hold_it() -> None:
    assert site(12) == LockSite(F, 12, HeldLock("a", 4, 12), ())
    assert site(13) == LockSite(F, 13, None, (HeldLock("a", 4, 12),))
    assert site(14) == LockSite(F, 14, HeldLock("b", 5, 14), (HeldLock("a", 4, 12),))


def test_only_module_level_locks_the_file_binds_once_are_named() -> None:
    # a parameter that shadows the module's lock: not the module's, only named (the dump's locals tell)
    assert site(19) == LockSite(F, 19, None, (), takes_local="shadowed")
    assert site(33) is None  # self._lock: whose? and `rebound` is assigned twice
    assert site(24) is None  # `with a, b:` stopped on its line: which of the two does it wait for?
    assert site(25) == LockSite(F, 25, None, (HeldLock("a", 4, 24), HeldLock("b", 5, 24)))


def test_a_function_defined_inside_a_with_does_not_hold_its_lock() -> None:
    assert site(41) == LockSite(F, 41, HeldLock("a", 4, 41), ())
    assert site(38) == LockSite(F, 38, None, (HeldLock("b", 5, 37),))  # module code inside `with b:`


def test_a_lone_acquire_call_takes_its_lock() -> None:
    assert site(47) == LockSite(F, 47, HeldLock("b", 5, 47), (HeldLock("a", 4, 46),))
    assert site(48) == LockSite(F, 48, None, (HeldLock("a", 4, 46),))  # a timed acquire: it gives up
    assert site(49) == LockSite(F, 49, HeldLock("shadowed", 8, 49), (HeldLock("a", 4, 46),))


def test_unparsable_source_gives_nothing() -> None:
    assert sites_in(b"def (:\n", F, [1]) == []


def thread(tid: int, *lines: int, file: str = F, active: bool = False) -> ThreadStack:
    return ThreadStack(tid, f"T{tid}", tuple(Frame("f", file, line) for line in lines), "S", active)


def test_a_source_file_changed_after_the_process_started_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_bytes(SOURCE)
    path.chmod(0o644)
    stacks = [
        ProcessStack(os.getpid(), "py-spy", (thread(1, 14, file=str(path)), thread(2, 13, file=str(path))))
    ]
    later = time.time() + 2  # past the second of slack after this process's start, however young it is
    os.utime(path, (later, later))
    assert lock_sites(stacks) == {}  # changed after this process started
    old = time.time() - 10 * 24 * 3600
    os.utime(path, (old, old))
    found = lock_sites(stacks)
    assert found[(str(path), 14)].takes == HeldLock("b", 5, 14)
    assert found[(str(path), 13)].holds == (HeldLock("a", 4, 12),)


ABBA = {
    (F, 14): LockSite(F, 14, HeldLock("b", 5, 14), (HeldLock("a", 4, 12),)),
    (F, 41): LockSite(F, 41, HeldLock("a", 4, 41), (HeldLock("b", 5, 40),)),
    (F, 50): LockSite(F, 50, None, (HeldLock("b", 5, 49),)),
}


def test_two_idle_threads_each_holding_what_the_other_waits_for_are_a_cycle() -> None:
    stacks = [ProcessStack(100, "py-spy", (thread(1, 20), thread(3, 41), thread(2, 14)))]
    (cycle,) = lock_cycles(stacks, ABBA)
    assert cycle.pid == 100
    assert [(s.thread.tid, s.lock.name, s.holder.tid) for s in cycle.steps] == [(2, "b", 3), (3, "a", 2)]


def test_no_cycle_without_a_holder_the_source_shows_or_with_a_running_thread() -> None:
    waiting_for_a_sleeper = [ProcessStack(100, "py-spy", (thread(1, 14), thread(2, 50)))]
    assert lock_cycles(waiting_for_a_sleeper, ABBA) == []
    running = [ProcessStack(100, "py-spy", (thread(2, 14), thread(3, 41, active=True)))]
    assert lock_cycles(running, ABBA) == []


def test_wait_chain_names_the_threads_and_locks_of_the_cycle() -> None:
    ev = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=100,
        hang_window_s=60.0,
        quiet_for_s=60.0,
        stacks=(ProcessStack(100, "py-spy", (thread(2, 14), thread(3, 41))),),
        lock_sites=ABBA,
    )
    first = explain(ev)[0]
    assert first.rule == "wait-chain" and first.pids == (100,)
    assert first.title == "Deadlock: 2 threads of pid 100 wait for each other's locks (a, b)"
    assert (
        'thread 2 "T2" waits at /src/app.py:14 for lock b (made at line 5), which thread 3' in first.summary
    )
    assert 'thread 3 "T3" waits at line 41 for lock a (made at line 4)' in first.summary
    assert "no-progress" not in [f.rule for f in explain(ev)]


def test_a_file_the_jobs_user_could_not_read_is_not_read_for_it(tmp_path: Path) -> None:
    path = tmp_path / "secret.py"
    path.write_bytes(SOURCE)
    path.chmod(0o600)
    nobody = 65534
    assert source_of(path, time.time(), {nobody}) is None  # the shim may read it; the job's user may not
    assert source_of(path, time.time(), {os.geteuid()}) == SOURCE
    path.chmod(0o644)
    assert source_of(path, time.time(), {nobody}) == SOURCE


INSTANCES = b"""\
import threading


class Cache:
    def __init__(self):
        self._lock = threading.Lock()
        self.other = None

    def fill(self):
        with self._lock:
            self.other.drain()

    def drain(self):
        with self._lock:
            pass


class Other:
    def run(self):
        with self._lock:
            pass
"""
G = "/src/cache.py"
A, B, C = 0x7F0000001000, 0x7F0000002000, 0x7F0000003000


def test_an_attribute_lock_its_class_binds_once_is_named_in_that_class_alone() -> None:
    takes = sites_in(INSTANCES, G, [14])[0].takes
    assert takes == HeldLock("self._lock", 6, 14, attribute=True)
    assert sites_in(INSTANCES, G, [11])[0].holds == (HeldLock("self._lock", 6, 10, attribute=True),)
    assert sites_in(INSTANCES, G, [20]) == []  # Other's self._lock is not the one Cache makes
    rebinds = INSTANCES + b"\n\ndef swap(cache):\n    cache._lock = threading.RLock()\n"
    assert sites_in(rebinds, G, [14, 11]) == []  # which lock a `with self._lock:` takes depends on when


def crossing(owner_a: int | None, owner_b: int | None) -> list[ProcessStack]:
    """Two threads, each in drain() of one cache called from fill() of the other."""

    def one(tid: int, waits_on: int | None, holds: int | None) -> ThreadStack:
        frames = (Frame("Cache.drain", G, 14, owner=waits_on), Frame("Cache.fill", G, 11, owner=holds))
        return ThreadStack(tid, f"T{tid}", frames, "S", False)

    return [ProcessStack(100, "py-spy", (one(1, owner_b, owner_a), one(2, owner_a, owner_b)))]


def test_threads_crossing_two_objects_locks_are_a_cycle_only_where_the_dump_read_each_self() -> None:
    sites = {(G, line): s for s in sites_in(INSTANCES, G, [11, 14]) for line in [s.line]}
    (cycle,) = lock_cycles(crossing(A, B), sites)
    assert [(s.thread.tid, s.holder.tid) for s in cycle.steps] == [(1, 2), (2, 1)]
    assert cycle.locks == [f"self._lock of object {B:#x}", f"self._lock of object {A:#x}"]
    assert lock_cycles(crossing(None, None), sites) == []  # no `self` read: which object? no edge
    other = [ProcessStack(100, "py-spy", (crossing(A, B)[0].threads[0], crossing(A, C)[0].threads[1]))]
    assert lock_cycles(other, sites) == []  # thread 2 holds C's lock: not the B's thread 1 waits for


def test_only_a_process_whose_threads_wait_for_and_hold_an_instance_lock_is_dumped_again() -> None:
    sites = {(G, line): s for s in sites_in(INSTANCES, G, [11, 14]) for line in [s.line]}
    assert wanting_owners(crossing(None, None), sites) == [100]
    assert wanting_owners(crossing(A, B), sites) == []  # its owners read already
    alone = [ProcessStack(100, "py-spy", (crossing(None, None)[0].threads[0],))]
    assert wanting_owners(alone, sites) == []  # the one thread that holds one is the waiter itself

"""Python lock cycles from stacks and source: which `with` locks a line takes and holds (probes.withlocks),
and the threads that wait for each other's (rules.hang.lockcycle, through wait-chain)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobwarden.observations import Frame, HeldLock, LockSite, ProcessStack, ThreadStack
from jobwarden.probes.pysource import source_of
from jobwarden.probes.withlocks import lock_sites, sites_in
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
    assert site(19) is None  # a parameter that shadows the module's lock
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

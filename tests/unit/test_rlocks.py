"""An RLock's owner, read from a live process's memory (probes.rlocks through osapi.procmem), and the
chain of threads the owners draw (rules.hang.rlockchain, through wait-chain)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jobwarden.observations import Frame, LocalRLock, LockSite, ProcessStack, ThreadStack, Wait
from jobwarden.osapi.procmem import MAX_READ, ProcessMemory
from jobwarden.probes import rlocks, withlocks
from jobwarden.probes.withlocks import sites_in, wanting_owners
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.hang.rlockchain import rlock_chains

# a child holding one RLock twice in a thread of its own, with a free RLock and a plain Lock beside it
HOLDS = """
import sys, threading
held, free, plain = threading.RLock(), threading.RLock(), threading.Lock()
taken = threading.Event()
def hold():
    held.acquire(); held.acquire(); taken.set(); threading.Event().wait()
threading.Thread(target=hold, daemon=True).start()
taken.wait()
print(id(held), id(free), id(plain), flush=True)
import re; print(re.search(r"owner=(\\d+)", repr(held))[1], flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder() -> Iterator[tuple[int, list[int], int]]:
    with subprocess.Popen(
        [sys.executable, "-c", HOLDS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        try:
            held, free, plain = (int(x) for x in proc.stdout.readline().split())
            owner = int(proc.stdout.readline())
            yield proc.pid, [held, free, plain], owner
        finally:
            proc.kill()


def threads_naming(addresses: list[int], owner: int) -> tuple[ThreadStack, ...]:
    names = ("held", "free", "plain")
    frame = Frame(
        "f", "/x.py", 3, rlocks=tuple(LocalRLock(n, a) for n, a in zip(names, addresses, strict=True))
    )
    return (ThreadStack(1, "MainThread", (frame,), ident=1), ThreadStack(2, "holder", (), ident=owner))


def test_the_owner_and_count_of_a_held_rlock_are_read_from_memory(holder: tuple[int, list[int], int]) -> None:
    pid, addresses, owner = holder
    threads = rlocks.with_owners(pid, threads_naming(addresses, owner))
    held, free, plain = threads[0].frames[0].rlocks
    assert (held.owner, held.count) == (owner, 2)  # what threading's own repr says, taken twice
    assert (free.owner, free.count) == (0, 0)
    assert plain.owner is None  # a Lock is no RLock: its type's name says so, nothing is read from it
    assert rlocks.owned_by(held, threads) is threads[1]


def test_an_address_that_is_no_rlock_or_not_mapped_reads_as_unknown(
    holder: tuple[int, list[int], int],
) -> None:
    pid, addresses, owner = holder
    bogus = [addresses[0] + 8, 0x10, (1 << 47) - 4096]  # inside the object, the zero page, unmapped
    threads = rlocks.with_owners(pid, threads_naming(bogus, owner))
    assert all(r.owner is None for r in threads[0].frames[0].rlocks)


def test_a_gone_process_leaves_the_locks_unread(holder: tuple[int, list[int], int]) -> None:
    pid, addresses, owner = holder
    proc_threads = threads_naming(addresses, owner)
    assert rlocks.with_owners(2**22 + 7, proc_threads) == proc_threads  # no such pid: nothing raised
    with ProcessMemory(pid) as mem:
        assert len(mem.read(addresses[0], 10_000)) == MAX_READ  # bounded
        assert mem.read(-5, 8) == b""


def test_the_memory_of_another_users_process_is_not_read_without_the_right() -> None:
    # a process that may not ptrace the target (it dropped to nobody) gets AccessDenied, never a crash
    code = (
        "import os, subprocess, sys\n"
        "from jobwarden.errors import AccessDenied\n"
        "from jobwarden.osapi.procmem import ProcessMemory\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n    ProcessMemory(1)\nexcept AccessDenied:\n    print('denied')\n"
    )
    if os.geteuid() != 0:
        pytest.skip("needs root to become nobody")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "denied", out.stderr


WAITING = b"""\
import threading


def transfer(debit, credit):
    with debit:
        with credit:
            pass


def pay(lock):
    lock.acquire()


def shown(item):
    with item.lock:
        pass
"""


def test_a_with_or_acquire_of_a_local_name_is_taken_by_that_name() -> None:
    sites = {s.line: s for s in sites_in(WAITING, "/job/bank.py", [5, 6, 7, 11, 15])}
    assert sites[5].takes_local == "debit" and sites[5].takes is None
    assert sites[6].takes_local == "credit"
    assert 7 not in sites  # inside the `with`, no lock taken here, and none the source names held
    assert sites[11].takes_local == "lock"
    assert 15 not in sites  # an attribute of a local: which object, no local tells


def idle(tid: int, ident: int, name: str, *frames: Frame) -> ThreadStack:
    return ThreadStack(tid, name, frames, active=False, ident=ident)


def test_a_job_thread_at_a_local_lock_asks_for_the_locals_and_a_librarys_does_not() -> None:
    site = {("/job/bank.py", 5): LockSite("/job/bank.py", 5, None, (), "debit")}
    lib = "/usr/lib/python3.11/threading.py"
    site[(lib, 320)] = LockSite(lib, 320, None, (), "waiter")
    job = ProcessStack(
        10, "py-spy", (idle(10, 1, "a", Frame("transfer", "/job/bank.py", 5)), idle(11, 2, "b"))
    )
    library = ProcessStack(20, "py-spy", (idle(20, 1, "a", Frame("wait", lib, 320)), idle(21, 2, "b")))
    assert wanting_owners([job, library], site) == [10]


BANK = "/job/bank.py"
SITES = {
    (BANK, 6): LockSite(BANK, 6, None, (), "credit"),
    (BANK, 11): LockSite(BANK, 11, None, (), "lock"),
}
A, B = 0xA000, 0xB000


def at(line: int, *locks: LocalRLock) -> Frame:
    return Frame("transfer", BANK, line, rlocks=locks)


def hung(*stacks: ProcessStack, waits: tuple[Wait, ...] = ()) -> RunEvidence:
    return RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=10,
        hang_window_s=60.0,
        quiet_for_s=60.0,
        stacks=stacks,
        lock_sites=SITES,
        waits=waits,
    )


def test_two_threads_owning_the_rlock_the_other_waits_for_are_a_deadlock() -> None:
    one = idle(11, 111, "one", at(6, LocalRLock("debit", A, 111, 1), LocalRLock("credit", B, 222, 1)))
    two = idle(12, 222, "two", at(6, LocalRLock("debit", B, 222, 1), LocalRLock("credit", A, 111, 1)))
    main = idle(10, 100, "MainThread", Frame("join", "/usr/lib/python3.11/threading.py", 1119))
    first = explain(hung(ProcessStack(10, "py-spy", (main, one, two))))[0]
    assert first.rule == "wait-chain" and first.pids == (10,)
    assert first.title == "Deadlock: 2 threads of pid 10 wait for each other's RLocks"
    assert (
        'thread 11 "one" waits at /job/bank.py:6 for RLock `credit` at 0xb000 held by thread 12 "two", which'
        in (first.summary)
    )


def test_a_free_or_own_or_unread_rlock_draws_no_edge() -> None:
    free = idle(11, 111, "one", at(6, LocalRLock("credit", B, 0, 0)))
    own = idle(12, 222, "two", at(6, LocalRLock("credit", A, 222, 3)))
    unread = idle(13, 333, "three", at(6, LocalRLock("credit", A)))
    assert rlock_chains([ProcessStack(10, "py-spy", (free, own, unread))], SITES) == []


def test_the_owner_that_ended_holding_the_lock_is_said() -> None:
    waiter = idle(11, 111, "pay", Frame("pay", BANK, 11, rlocks=(LocalRLock("lock", A, 999, 1),)))
    first = explain(hung(ProcessStack(10, "py-spy", (waiter, idle(10, 100, "MainThread")))))[0]
    assert first.title == (
        'Thread 11 "pay" of pid 10 waits for RLock `lock` at 0xa000 held by thread ident 999, which is no '
        "longer running (it ended holding the lock)"
    )


def test_the_chain_goes_on_through_the_owners_kernel_wait() -> None:
    waiter = idle(11, 111, "pay", Frame("pay", BANK, 11, rlocks=(LocalRLock("lock", A, 222, 1),)))
    owner = idle(12, 222, "refresh", Frame("refresh", BANK, 20))
    ev = hung(
        ProcessStack(10, "py-spy", (idle(10, 100, "MainThread"), waiter, owner)),
        waits=(
            Wait(10, 12, "pipe-read", "read", "pipe:[5]", (30,)),
            Wait(30, 30, "sleep", "nanosleep", "a sleep"),
        ),
    )
    first = explain(ev)[0]
    assert first.pids[0] == 30
    assert first.title.endswith(
        'held by thread 12 "refresh", which reads a pipe whose write end pid 30 still holds open'
    )


def test_a_file_that_takes_no_lock_by_a_plain_name_is_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    # cheap: most files of a stack have `with open(...)`, not `with lock:`, and no `Lock(`
    parsed: list[str] = []
    real = ast.parse

    def counted(source: bytes, file: str) -> ast.Module:
        parsed.append(file)
        return real(source, file)

    monkeypatch.setattr(withlocks.ast, "parse", counted)
    assert sites_in(b"with open(x) as f:\n    f.read()\n", "/job/io.py", [1]) == []
    assert parsed == []
    assert sites_in(b"def f(lock):\n    with lock:\n        pass\n", "/job/jobs.py", [2]) != []
    assert parsed == ["/job/jobs.py"]


def test_an_rlock_wait_off_the_kernels_chain_leaves_the_chain_to_speak() -> None:
    waiter = idle(31, 111, "pay", Frame("pay", BANK, 11, rlocks=(LocalRLock("lock", A, 222, 1),)))
    owner = idle(32, 222, "refresh", Frame("refresh", BANK, 20))
    other = ProcessStack(30, "py-spy", (idle(30, 100, "MainThread"), waiter, owner))
    ev = hung(other, waits=(Wait(10, 10, "file-lock", "flock", "/data/cache.lock", (40,)),))
    first = explain(ev)[0]
    assert first.title == "Waits for a file lock on /data/cache.lock held by pid 40" and first.pids[0] == 40


def test_an_owner_that_sleeps_is_said_to_sleep_where_its_code_is() -> None:
    waiter = idle(11, 111, "pay", Frame("pay", BANK, 11, rlocks=(LocalRLock("lock", A, 222, 1),)))
    owner = idle(12, 222, "refresh", Frame("refresh", BANK, 20))
    ev = hung(
        ProcessStack(10, "py-spy", (idle(10, 100, "MainThread"), waiter, owner)),
        waits=(Wait(10, 12, "sleep", "clock_nanosleep", "a sleep"),),
    )
    first = explain(ev)[0]
    assert first.title.endswith('held by thread 12 "refresh", which sleeps'), first
    assert first.summary.endswith('held by thread 12 "refresh", which sleeps at refresh (/job/bank.py:20).')

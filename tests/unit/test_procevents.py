"""The kernel's process-event connector: messages parsed from bytes laid out as include/uapi/linux/cn_proc.h
says, and a real listener that sees a child's fork and its death by SIGKILL."""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import time

from jobwarden.osapi.procevents import (
    MAX_FOLLOWED,
    ProcEvent,
    ProcEventListener,
    follow_filter,
    last_pid,
    parse,
    wall_time,
)
from tests.conftest import require_kernel_process_events

HEAD = struct.pack("=IHHII", 0, 3, 0, 0, 0) + struct.pack("=IIIIHH", 1, 1, 0, 0, 0, 0)  # nlmsghdr + cn_msg


def message(what: int, at_ns: int, data: bytes) -> bytes:
    return HEAD + struct.pack("=IIQ", what, 0, at_ns) + data


def test_a_fork_names_the_child_process_and_its_parent() -> None:
    raw = message(0x1, 123, struct.pack("=iiii", 10, 10, 42, 42))
    assert parse(raw) == ProcEvent("fork", 42, 10, 123)


def test_a_new_thread_is_no_new_process() -> None:
    assert parse(message(0x1, 1, struct.pack("=iiii", 10, 10, 43, 42))) is None


def test_an_exit_carries_the_wait_status_of_the_thread_group_leader() -> None:
    raw = message(0x80000000, 9, struct.pack("=iiIIii", 42, 42, 9, 17, 10, 10))
    assert parse(raw) == ProcEvent("exit", 42, 10, 9, 9)
    other_thread = message(0x80000000, 9, struct.pack("=iiIIii", 43, 42, 0, 17, 10, 10))
    assert parse(other_thread) is None


def test_exec_uid_changes_and_truncated_messages() -> None:
    assert parse(message(0x2, 5, struct.pack("=ii", 42, 42))) == ProcEvent("exec", 42, 0, 5)
    assert parse(message(0x4, 5, struct.pack("=iiii", 42, 42, 0, 0))) is None  # PROC_EVENT_UID
    assert parse(message(0x80000000, 9, b"\0" * 8)) is None  # cut short
    assert parse(HEAD[:20]) is None


def test_the_kernels_timestamp_becomes_unix_time() -> None:
    assert abs(wall_time(time.monotonic_ns()) - time.time()) < 0.5


def test_a_real_listener_sees_a_fork_and_a_death_by_sigkill() -> None:
    require_kernel_process_events()
    listener = ProcEventListener.open()
    try:
        child = subprocess.Popen(["sh", "-c", "kill -9 $$"])
        child.wait(timeout=30)
        seen: list[ProcEvent] = []
        deadline = time.monotonic() + 10
        while not any(e.kind == "exit" and e.pid == child.pid for e in seen):
            left = deadline - time.monotonic()
            assert left > 0, f"no exit event for {child.pid}: {seen[-5:]}"
            select.select([listener], [], [], left)
            seen += listener.read()
        (fork,) = [e for e in seen if e.kind == "fork" and e.pid == child.pid]
        assert fork.ppid == os.getpid()
        (end,) = [e for e in seen if e.kind == "exit" and e.pid == child.pid]
        assert end.wait_status == signal.SIGKILL
        assert fork.at_ns <= end.at_ns
    finally:
        listener.close()


def events_until_exit(listener: ProcEventListener, pid: int) -> list[ProcEvent]:
    """Every event read up to `pid`'s exit (the kernel queues them in order: all before it are in)."""
    seen: list[ProcEvent] = []
    deadline = time.monotonic() + 10
    while not any(e.kind == "exit" and e.pid == pid for e in seen):
        left = deadline - time.monotonic()
        assert left > 0, f"no exit event for {pid}: {seen[-5:]}"
        select.select([listener], [], [], left)
        seen += listener.read()
    return seen + listener.read()


def test_the_kernel_drops_the_events_of_processes_not_followed() -> None:
    """Issue 25: the host's every fork and exit woke every supervisor. Followed: this process; its child
    is seen born and ended, the grandchild (a child of a process not followed) is not."""
    require_kernel_process_events()
    listener = ProcEventListener.open()
    try:
        assert listener.follow([os.getpid()], born_after=None)
        listener.read()  # queued before the filter was attached: the host's other processes' events
        child = subprocess.Popen(["sh", "-c", "sleep 0 & wait"])
        child.wait(timeout=30)
        seen = events_until_exit(listener, child.pid)
    finally:
        listener.close()
    about_child = {(e.kind, e.pid) for e in seen if child.pid in (e.pid, e.ppid)}
    assert about_child == {("fork", child.pid), ("exit", child.pid)}  # none of its own child's
    assert all(e.ppid == os.getpid() or e.pid == os.getpid() for e in seen)  # nor anyone else's


def test_a_process_born_after_the_mark_is_followed_before_the_supervisor_knows_it() -> None:
    """A shell the job starts forks its own children at once, before the shim has followed the shell:
    their births pass as born after the mark read before the last drain."""
    require_kernel_process_events()
    listener = ProcEventListener.open()
    try:
        assert listener.follow([os.getpid()], born_after=last_pid())
        child = subprocess.Popen(["sh", "-c", "sleep 0 & wait"])
        child.wait(timeout=30)
        seen = events_until_exit(listener, child.pid)
    finally:
        listener.close()
    grandchildren = [e for e in seen if e.kind == "fork" and e.ppid == child.pid]
    assert len(grandchildren) == 1
    assert ("exit", grandchildren[0].pid) in {(e.kind, e.pid) for e in seen}


def test_the_exec_of_a_process_born_after_the_mark_is_not_followed() -> None:
    """Issue 25: every process the host starts execs; letting those through woke every supervisor on a
    busy machine. A child the shim holds at its fork is read again once followed (test_hooks_events)."""
    require_kernel_process_events()
    listener = ProcEventListener.open()
    try:
        assert listener.follow([os.getpid()], born_after=last_pid())
        listener.read()  # queued before the filter was attached
        child = subprocess.Popen(["sh", "-c", "exit 0"])
        child.wait(timeout=30)
        seen = events_until_exit(listener, child.pid)
    finally:
        listener.close()
    assert ("exec", child.pid) not in {(e.kind, e.pid) for e in seen}
    assert ("fork", child.pid) in {(e.kind, e.pid) for e in seen}


def test_the_filter_fits_the_kernels_limit_and_follows_every_process_past_it() -> None:
    code = follow_filter(range(1, MAX_FOLLOWED + 1), born_after=100)
    assert len(code) <= 4096  # BPF_MAXINSNS
    assert all(0 <= k < 2**32 for _, _, _, k in code)
    assert len(follow_filter(None, None)) < 200  # past MAX_FOLLOWED: only threads' events are dropped

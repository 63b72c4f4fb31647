"""The wait-for graph's parsers (probes.waits) and the chain the rule follows (rules.hang.waits)."""

from __future__ import annotations

import dataclasses

from jobwarden.observations import Wait, WaitParty
from jobwarden.probes.waits import parse_locks, parse_syscall, parse_tcp, shown_address
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.hang.waits import follow

X86 = {0: "read", 61: "wait4", 73: "flock", 230: "clock_nanosleep"}
MAIN, CHILD, HOLDER = 100, 101, 777


def test_a_syscall_line_gives_the_call_and_its_arguments() -> None:
    line = "61 0xffffffff 0x7ffc8 0x0 0x0 0x0 0x0 0x7ffc0 0x7f12\n"
    assert parse_syscall(line, X86) == ("wait4", [0xFFFFFFFF, 0x7FFC8, 0, 0, 0, 0])
    assert parse_syscall("running\n", X86) == (None, [])
    assert parse_syscall("-1 0x7ffc0 0x7f12\n", X86) == (None, [])
    assert parse_syscall("202 0x1 0x0 0x0 0x0 0x0 0x0 0x1 0x2\n", X86)[0] is None  # a futex: no far side


def test_the_lock_table_lists_holders_and_leaves_waiters_out() -> None:
    text = (
        "1: FLOCK  ADVISORY  WRITE 777 00:2b:1234 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 101 00:2b:1234 0 EOF\n"
        "2: POSIX  ADVISORY  WRITE 555 fd:01:99 0 EOF\n"
        "3: OFDLCK ADVISORY  READ  -1 fd:01:98 0 EOF\n"
    )
    assert parse_locks(text) == {(0, 0x2B, 1234): [777], (0xFD, 1, 99): [555]}


def hung(*waits: Wait, parties: dict[int, WaitParty] | None = None) -> RunEvidence:
    return RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=MAIN,
        hang_window_s=60.0,
        quiet_for_s=60.0,
        waits=waits,
        wait_parties=parties or {},
    )


def test_a_chain_through_a_child_ends_at_the_lock_holder_outside_the_job() -> None:
    ev = hung(
        Wait(MAIN, MAIN, "child", "wait4", f"child pid {CHILD}", (CHILD,)),
        Wait(CHILD, CHILD, "file-lock", "flock", "/data/cache.lock", (HOLDER,)),
        Wait(HOLDER, HOLDER, "sleep", "clock_nanosleep", "a sleep"),
        parties={HOLDER: WaitParty(HOLDER, "flock /data/cache.lock sleep 1d", "bob", in_job=False)},
    )
    first = explain(ev)[0]
    assert first.rule == "wait-chain"
    assert first.pids == (HOLDER, MAIN, CHILD)
    assert (
        first.title
        == "Waits for a file lock on /data/cache.lock held by pid 777 (flock /data/cache.lock sleep 1d),"
        " user bob, not a job of yours"
    )
    assert "pid 777 sleeps: everything waits for it" in first.summary
    assert "no-progress" not in [f.rule for f in explain(ev)]


def test_two_processes_waiting_for_each_other_are_a_deadlock() -> None:
    chain = follow(
        MAIN,
        [
            Wait(MAIN, MAIN, "pipe-write", "write", "pipe:[1]", (CHILD,)),
            Wait(CHILD, CHILD, "child", "wait4", f"child pid {MAIN}", (MAIN,)),
        ],
    )
    assert chain is not None and chain.cycle and chain.end == MAIN


def test_a_reader_holding_its_own_pipes_write_end_is_named_with_itself() -> None:
    ev = hung(Wait(MAIN, MAIN, "pipe-read", "read", "pipe:[9]", (MAIN,)))
    first = explain(ev)[0]
    assert first.rule == "wait-chain" and first.pids[0] == MAIN
    assert first.title == "Reads a pipe (pipe:[9]) whose write end it holds open itself"


def test_a_sleep_or_a_wait_with_nobody_on_the_far_side_draws_no_chain() -> None:
    asleep = hung(Wait(MAIN, MAIN, "sleep", "clock_nanosleep", "a sleep"))
    assert [f.rule for f in explain(asleep)] == ["no-progress"]
    unknown = hung(Wait(MAIN, MAIN, "file-lock", "flock", "/x.lock", ()))
    assert [f.rule for f in explain(unknown)] == ["no-progress"]
    healthy = dataclasses.replace(asleep, hang_window_s=None)  # not judged hung: no hang rule speaks
    assert [f.rule for f in explain(healthy)] == []


def test_the_tcp_table_gives_each_sockets_two_ends_and_inode() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1\n"
        "   1: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 5552 1\n"
        "   2: 0100007F:D431 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 5553 1\n"
        "   3: 0100007F:D432 0100007F:1F41 06 00000000:00000000 00:00000000 00000000     0        0 0 1\n"
    )
    rows = parse_tcp(text)
    assert rows[2] == ("0100007F:D431", "0100007F:1F40", "5553")
    assert len(rows) == 3  # a TIME_WAIT socket has no inode: nobody holds it
    assert shown_address("0100007F:1F40") == "127.0.0.1:8000"
    assert shown_address("00000000000000000000000001000000:1F40") == "port 8000"


def test_a_wrapper_waiting_for_a_child_stuck_on_a_futex_is_left_to_no_progress() -> None:
    # bash -> python hung on a Python lock: the chain of children says nothing the stacks do not say better
    stuck = hung(Wait(MAIN, MAIN, "child", "wait4", "any child", (CHILD,)))
    assert [f.rule for f in explain(stuck)] == ["no-progress"]
    asleep = hung(
        Wait(MAIN, MAIN, "child", "wait4", "any child", (CHILD,)),
        Wait(CHILD, CHILD, "sleep", "clock_nanosleep", "a sleep"),
    )
    assert explain(asleep)[0].title == f"Waits for its child pid {CHILD}"


def test_a_fifo_is_named_by_its_path_an_anonymous_pipe_is_not() -> None:
    outside = {HOLDER: WaitParty(HOLDER, "bash feeder.sh", "bob", in_job=False)}
    fifo = hung(Wait(MAIN, MAIN, "pipe-read", "read", "/data/feed.fifo", (HOLDER,)), parties=outside)
    assert explain(fifo)[0].title == (
        "Reads the FIFO /data/feed.fifo whose write end pid 777 (bash feeder.sh), user bob, not a job of"
        " yours still holds open"
    )
    full = hung(Wait(MAIN, MAIN, "pipe-write", "write", "/data/out.fifo", (HOLDER,)), parties=outside)
    assert explain(full)[0].title == (
        "Writes into the full FIFO /data/out.fifo that pid 777 (bash feeder.sh), user bob, not a job of yours"
        " does not read"
    )
    pipe = hung(Wait(MAIN, MAIN, "pipe-write", "write", "pipe:[5]", (HOLDER,)), parties=outside)
    assert explain(pipe)[0].title.startswith("Writes into a full pipe that pid 777")

"""osapi.asking with real processes: a signal meant to be caught goes only to a process that catches it now,
runs the program named, and is still the process it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jobwarden.model import ProcessId
from jobwarden.osapi import asking
from jobwarden.osapi.procfs import ProcFS, parse_signal_masks
from tests.conftest import start_time

PROCFS = ProcFS()
CATCHES_USR1 = """
import signal, sys
signal.signal(signal.SIGUSR1, lambda *_: print("caught", flush=True))
print("ready", flush=True)
for line in sys.stdin:
    pass
"""


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # reaps it and closes its pipes


def start(started: list[subprocess.Popen[bytes]], *argv: str) -> tuple[subprocess.Popen[bytes], ProcessId]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    started.append(proc)
    born = start_time(proc.pid)
    assert born is not None
    return proc, ProcessId(proc.pid, born)


def program(pid: int) -> tuple[int, int]:
    st = os.stat(f"/proc/{pid}/exe")
    return st.st_dev, st.st_ino


def test_a_process_that_catches_the_signal_gets_it(processes: list[subprocess.Popen[bytes]]) -> None:
    proc, who = start(processes, sys.executable, "-c", CATCHES_USR1)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    assert asking.ask(PROCFS, who, signal.SIGUSR1, program(proc.pid)) is asking.Answer.HANDLED
    assert proc.stdout.readline() == b"caught\n"
    assert proc.poll() is None


def test_a_process_that_does_not_catch_it_is_left_alone(processes: list[subprocess.Popen[bytes]]) -> None:
    proc, who = start(processes, "sleep", "3600")
    assert asking.ask(PROCFS, who, signal.SIGUSR1) is asking.Answer.NOT_CAUGHT
    assert asking.ask(PROCFS, who, signal.SIGUSR1, blocked_ok=True) is asking.Answer.NOT_CAUGHT
    assert proc.poll() is None and start_time(proc.pid) == who.start_time


def test_another_program_is_left_alone_even_if_it_catches_the_signal(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    """As after an exec(): the advert names the interpreter, the process now runs something else."""
    sleep, _ = start(processes, "sleep", "3600")
    proc, who = start(processes, sys.executable, "-c", CATCHES_USR1)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    assert asking.ask(PROCFS, who, signal.SIGUSR1, program(sleep.pid)) is asking.Answer.OTHER_PROGRAM
    assert proc.poll() is None


def test_a_process_that_is_gone_or_reused_is_not_signalled(processes: list[subprocess.Popen[bytes]]) -> None:
    proc, who = start(processes, "sleep", "3600")
    assert asking.ask(PROCFS, ProcessId(who.pid, who.start_time - 1), signal.SIGKILL) is asking.Answer.GONE
    assert proc.poll() is None
    proc.kill()
    proc.communicate()
    assert asking.ask(PROCFS, who, signal.SIGUSR1) is asking.Answer.GONE


def test_a_blocked_signal_counts_when_the_caller_knows_its_handler_is_coming(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    code = (
        "import signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2}); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    proc, who = start(processes, sys.executable, "-c", code)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    assert asking.will_handle(PROCFS, who, signal.SIGUSR2) is asking.Answer.NOT_CAUGHT
    assert asking.ask(PROCFS, who, signal.SIGUSR2, blocked_ok=True) is asking.Answer.HANDLED
    assert proc.poll() is None  # pending, not delivered


def test_signal_masks_are_parsed() -> None:
    masks = parse_signal_masks(
        "Name:\tx\nSigBlk:\t0000000000010000\nSigIgn:\t0000000000001000\nSigCgt:\t0000000280000002\n"
    )
    assert masks.blocks(17) and not masks.blocks(16)
    assert masks.catches(2) and masks.catches(32) and masks.catches(34) and not masks.catches(1)
    assert masks.ignored == 0x1000
    assert parse_signal_masks("Name:\tx\n") == (0, 0, 0)

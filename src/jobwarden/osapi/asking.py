"""Signals that ask something of a process: sent only when the process catches them now.

jobwarden sends two kinds of signal. Those meant to end a process (SIGTERM, SIGKILL) need only its identity
(pid, start time) checked. Those meant to be *caught* (the faulthandler dump signal, SIGUSR1 asking a
supervisor to stop its job, a relayed engine signal) are different: nearly all of them end the process by
default (SIGUSR1, SIGUSR2 and every real-time signal terminate, signal(7)). A process may stop catching a
signal and keep its identity: execve(2) keeps the pid and start time and resets every caught signal to its
default. A Python process of a job that exec()s into a daemon (Ray's raylet is started that way) is still
named by its old faulthandler advert, and the dump signal would kill it.

So a signal that asks is sent through a pidfd opened before the checks (the pid cannot be reused meanwhile),
and only when:
- the process is still the one it was (start time);
- it still runs the program that said it handles the signal, where the caller knows it (exec() changes the
  program; the same binary exec()ed again starts over and must say so again);
- the kernel says the signal is caught now (SigCgt), or, for a caller that knows the handler is on its way
  (a supervisor forked with the signal blocked until its handlers are in), blocked.

What is left is the instant between the last check and the signal: an exec() exactly then still loses the
handler. Nothing in the kernel's interface closes that window; it is microseconds against the seconds
between dumps.
"""

from __future__ import annotations

import enum

from jobwarden.errors import ProcessGone
from jobwarden.model import ProcessId
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.procfs import ProcFS


class Answer(enum.Enum):
    """What a check found; the value says why a signal was not sent, in words for a note."""

    HANDLED = "it catches the signal"
    GONE = "it has exited"
    OTHER_PROGRAM = "it runs another program than the one that said it handles the signal (it exec()ed)"
    NOT_CAUGHT = "it does not catch the signal now, whose default action would end it"


def will_handle(
    procfs: ProcFS,
    process: ProcessId,
    sig: int,
    program: tuple[int, int] | None = None,
    blocked_ok: bool = False,
) -> Answer:
    """Would `process` handle `sig` if it were sent now? `program` is the (device, inode) of the program
    that said it handles it (None: any program). Raises AccessDenied where /proc hides the answer."""
    if not procfs.identity_matches(process.pid, process.start_time):
        return Answer.GONE
    try:
        if program is not None and procfs.program(process.pid) != program:
            return Answer.OTHER_PROGRAM
        masks = procfs.signal_masks(process.pid)
    except ProcessGone:
        return Answer.GONE
    if masks.catches(sig) or (blocked_ok and masks.blocks(sig)):
        return Answer.HANDLED
    return Answer.NOT_CAUGHT


def ask(
    procfs: ProcFS,
    process: ProcessId,
    sig: int,
    program: tuple[int, int] | None = None,
    blocked_ok: bool = False,
) -> Answer:
    """Send `sig` to `process` if it will handle it (see `will_handle`); HANDLED means it was sent.
    Raises AccessDenied when we may not read its status or signal it."""
    try:
        fd = pidfds.open_pidfd(process.pid)
    except ProcessGone:
        return Answer.GONE
    try:
        return ask_through(fd, procfs, process, sig, program, blocked_ok)
    finally:
        pidfds.close(fd)


def ask_through(
    pidfd: int,
    procfs: ProcFS,
    process: ProcessId,
    sig: int,
    program: tuple[int, int] | None = None,
    blocked_ok: bool = False,
) -> Answer:
    """`ask`, through a pidfd on `process` that the caller holds (opened while it was surely that process:
    our own unreaped child)."""
    answer = will_handle(procfs, process, sig, program, blocked_ok)
    if answer is Answer.HANDLED and not pidfds.send_signal(pidfd, process.pid, sig):
        return Answer.GONE
    return answer

"""The shim's signals, as one part of its supervisor: they arrive on a wakeup pipe (the loop sleeps on it
with the job's pidfds), and become a stop request on the run's state. SIGUSR1 is `jobwarden stop` (its
request is read from the store), SIGTERM/SIGINT the shim's own end; an attached run's engine signals are
the engine link's (shim.run.enginestop)."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from jobwarden.errors import StoreError
from jobwarden.model import EndReason
from jobwarden.shim.record.recorder import log
from jobwarden.shim.run.enginestop import engine_signals
from jobwarden.shim.run.state import RunState, StopRequest


class Signals:
    def __init__(self, state: RunState) -> None:
        self.state = state
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.carried: set[int] = set()  # signals the previous attempt received and did not act on

    def install(self) -> None:
        self.state.jobos.install_signals(self.wake_w, engine_signals(self.state.engine))

    def close(self) -> None:
        # unhooked first: a signal after the close (SIGCHLD of an --on-event command still being
        # delivered) made CPython write to a closed fd: "Exception ignored ... signal wakeup fd"
        self.state.jobos.uninstall_signals(self.wake_w)
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def drain(self) -> set[int]:
        received: set[int] = set()
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self.wake_r, 64):
                received.update(data)
        return received

    def wait(self, timeout_s: float) -> None:
        """Sleep on the wakeup pipe alone, then act on what came (a queued run, a restart's backoff)."""
        self.state.jobos.wait([self.wake_r], timeout_s)
        self.handle(self.drain())

    def handle(self, received: set[int]) -> None:
        s = self.state
        if s.stop:
            return
        grace = s.job.options.grace_s
        if s.engine is not None:
            if s.engine.on_signals(received, s.main, s.clock.wall()):
                s.stop = StopRequest(EndReason.ENGINE_STOP, grace)
                return
            received = received - {signal.SIGTERM, signal.SIGINT}
        if signal.SIGUSR1 in received:
            try:
                record = self._stop_request()
            except StoreError as err:
                log(f"cannot read the stop request: {err}")
                return
            if record is not None:
                given = record.stop_grace
                s.stop = StopRequest(EndReason.STOPPED, given if given is not None else grace)
        if received & {signal.SIGTERM, signal.SIGINT}:
            log("shim received SIGTERM/SIGINT: stopping the job")
            s.stop = StopRequest(EndReason.STOPPED, grace)

    def _stop_request(self) -> Any:
        """The run whose record holds a stop request for this attempt, or None. `jobwarden stop` writes it
        on the run it saw last: between two attempts that may be the one that just ended (its end was
        being recorded, or the next run not yet made), so a request there that did not end that run is
        this one's to act on (a service restarting every 10 ms otherwise ran on, its stop lost)."""
        s = self.state
        record = s.store.run(s.job.id, s.run)
        if record.stop_requested_at:
            return record
        if s.run <= 1:
            return None
        before = s.store.run(s.job.id, s.run - 1)
        if before.stop_requested_at and before.end_reason != EndReason.STOPPED:
            return before
        return None

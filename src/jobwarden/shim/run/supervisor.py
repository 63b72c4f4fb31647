"""The shim's supervisor: start (or adopt) the job, watch its whole tree, record how it ended, leave
nothing.

It is a composition: one record of the run's state (shim/run/state.py) shared by a part for each phase,
`Starting` (starting.py), `Watching` (watching.py, the loop) and `Ending` (ending.py), with the shim's
`Signals` (signals.py) beside them. The supervisor makes them, runs them in order and hands an ended
attempt's signals to the next. The shim writes every state change to the store; the CLI only reads them,
except to mark a run `lost` when this process is found dead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobwarden.clock import Clock
from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.run.ending import Ending
from jobwarden.shim.run.jobos import JobOS
from jobwarden.shim.run.signals import Signals
from jobwarden.shim.run.starting import Starting
from jobwarden.shim.run.state import RunState
from jobwarden.shim.run.watching import Watching
from jobwarden.store import JobRecord, Store

if TYPE_CHECKING:
    from jobwarden.shim.record.notify import Notifier


class Supervisor:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        run: int,
        clock: Clock,
        procfs: ProcFS,
        notifier: Notifier | None = None,
        jobos: JobOS | None = None,
    ) -> None:
        self.state = RunState(store, job, run, clock, procfs, notifier, jobos)
        self.signals = Signals(self.state)
        self.watching = Watching(self.state, self.signals)
        self.ending = Ending(self.state, self.watching)
        self.starting = Starting(self.state, self.signals, self.ending)

    def launch(self, report_fd: int) -> int:
        """Start the job as our child and supervise it; returns the shim's exit code."""
        return self._supervise(self.starting.launch(report_fd))

    def adopt(self, report_fd: int) -> int:
        """Watch the processes of a run whose shim died: found by marker, held by pidfd."""
        return self._supervise(self.starting.adopt(report_fd))

    def carry_on_restart(self, report_fd: int) -> int:
        """`adopt` of a run whose shim died during its restart backoff: the restart, made now."""
        return self._supervise(self.starting.carry_on_restart(report_fd))

    def wait_backoff(self, delay_s: float) -> bool:
        """restarting: wait out the backoff before the next attempt; False if stopped meanwhile."""
        return self.starting.wait_backoff(delay_s)

    def end_before_start(self) -> int:
        """A restart or queued run that was stopped before its process existed."""
        return self.ending.end_unstarted()

    def take_over_signals(self, ended: Supervisor) -> None:
        """The ended attempt's signals become ours: our wakeup fd in before its goes, and what it
        received unread handed on. Between the two, a signal (an engine's SIGTERM as the attempt ended)
        met a no-op handler and no fd, and was lost: the job restarted, to be SIGKILLed by the engine."""
        self.signals.install()
        self.signals.carried |= ended.signals.drain()
        ended.close()

    def close(self) -> None:
        self.state.autoprofile.close()
        if self.state.fingerprint is not None:
            self.state.fingerprint.close()
        self.signals.close()

    def _supervise(self, started: int | None) -> int:
        """Watch a run that started until it must end, then end it; a start that ended already says so."""
        if started is not None:
            return started
        self.watching.watch()
        return self.ending.finish()

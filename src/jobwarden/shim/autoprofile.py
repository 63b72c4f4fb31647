"""The automatic profile: when a speed finding becomes current (rules.speed.SPEED_RULES: the job runs
slower than it should), a short profile is taken so the job's page and `explain` show what it was doing as
it slowed, with no one there to run `jobwarden profile`.

It runs as a child process (`jobwarden profile --trigger auto`), in a session of its own, so the loop
never waits for it; at most one at a time, and at most one per MIN_INTERVAL_S of a run: a finding that
comes and goes does not keep py-spy reading the job. The child is one of the shim's helpers: the tree
never takes it for the job's. Started by the shim, it descends from the tracer the hooks declared with
PR_SET_PTRACER, so py-spy may read the job's processes even under Yama ptrace_scope=1
(research/hang-diagnosis.md §1.7).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from jobwarden.errors import JobwardenError
from jobwarden.model import Finding
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.tool import reap_helper, start_helper
from jobwarden.paths import HOME_ENV
from jobwarden.rules.speed import SPEED_RULES

DURATION = "5s"
MIN_INTERVAL_S = 600.0
CLOSE_WAIT_S = 3.0


class AutoProfiler:
    def __init__(
        self,
        home: Path,
        job_id: int,
        run: int,
        monotonic: Callable[[], float],
        log: Callable[[str], None],
        min_interval_s: float = MIN_INTERVAL_S,
    ) -> None:
        self.home, self.job_id, self.run = home, job_id, run
        self.monotonic, self.log = monotonic, log
        self.min_interval_s = min_interval_s
        self.started_at: float | None = None
        self.child: tuple[int, int] | None = None  # (pid, pidfd) of the profile running now
        self.taken = 0

    def on_findings(self, findings: Sequence[Finding]) -> None:
        """Told of every finding recorded as new (shim.findings.LiveFindings)."""
        speed = [f.rule for f in findings if f.rule in SPEED_RULES]
        if speed:
            self.start(speed[0])

    def start(self, why: str) -> bool:
        self.poll()
        now = self.monotonic()
        if self.child is not None:
            return False  # never two at once
        if self.started_at is not None and now - self.started_at < self.min_interval_s:
            return False
        argv = [
            sys.executable, "-m", "jobwarden", "profile", str(self.job_id), "--run", str(self.run),
            "--duration", DURATION, "--trigger", "auto", "--json",
        ]  # fmt: skip
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            HOME_ENV: str(self.home),
            "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k in ("JOBWARDEN_PY_SPY", "PYTHONPATH")},
        }
        try:
            self.child = start_helper(argv, env)
        except JobwardenError as err:
            self.log(f"automatic profile not taken: {err.message}")
            return False
        self.started_at = now
        self.taken += 1
        self.log(f"automatic profile ({why}): `jobwarden profile` running as pid {self.child[0]}")
        return True

    def poll(self) -> None:
        """Forget the child once it ended (the shim's reaper collected it, or will)."""
        if self.child is not None and pidfds.has_exited(self.child[1]):
            reap_helper(self.child[1])
            pidfds.close(self.child[1])
            self.child = None

    def helper_pids(self) -> set[int]:
        return {self.child[0]} if self.child is not None else set()

    def close(self) -> None:
        """At the run's end: a profile still running is asked to stop (SIGINT: it kills py-spy's session
        and exits), then killed if it does not within CLOSE_WAIT_S."""
        self.poll()
        if self.child is None:
            return
        pid, fd = self.child
        try:
            pidfds.send_signal(fd, pid, signal.SIGINT)
            import select

            if not select.select([fd], [], [], CLOSE_WAIT_S)[0]:
                pidfds.send_signal(fd, pid, signal.SIGKILL)
                select.select([fd], [], [], CLOSE_WAIT_S)
            reap_helper(fd)
        except JobwardenError:
            pass
        finally:
            pidfds.close(fd)
            self.child = None

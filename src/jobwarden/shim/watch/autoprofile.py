"""The automatic profile: when a speed finding becomes current (rules.speed.SPEED_RULES: the job runs
slower than it should), a short profile is taken so the job's page and `explain` show what it was doing as
it slowed, with no one there to run `jobwarden profile`.

It runs as a child process (`jobwarden profile --trigger auto`), in a session of its own, so the loop
never waits for it; at most one at a time, and at most one per MIN_INTERVAL_S of a run: a finding that
comes and goes does not keep py-spy reading the job. The child is one of the shim's helpers: the tree
never takes it for the job's. Started by the shim, it descends from the tracer the hooks declared with
PR_SET_PTRACER, so py-spy may read the job's processes even under Yama ptrace_scope=1
(research/hang-diagnosis.md §1.7).

Its cost is the job's where they share a CPU quota: the CLI started inside a container's `--cpus` or a
Slurm step's cgroup leaves the shim, and so py-spy, in the job's quota. A 5 s profile in a 0.25-CPU quota
the job already fills took 20 s of runs to 22-27 s (issue 25). So no automatic profile is taken while the
shim's own quota throttles, unless JOBWARDEN_AUTO_PROFILE=always; every one taken is recorded with the CPU
it used (wait4's rusage of the child and the py-spy it waited for).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from jobwarden.config import AUTO_PROFILE_ENV
from jobwarden.errors import JobwardenError
from jobwarden.model import Finding
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.cpuquota import CpuCgroup, CpuStat, cpu_cgroup_of
from jobwarden.osapi.process import reap_measured
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
        note: Callable[..., None] | None = None,
        quota: SharedQuota | None = None,
    ) -> None:
        self.home, self.job_id, self.run = home, job_id, run
        self.monotonic, self.log = monotonic, log
        self.min_interval_s = min_interval_s
        self.note = note or (lambda kind, **fields: None)  # an event of the run: (kind, **fields)
        self.quota = quota if quota is not None else SharedQuota(os.getpid())
        self.mode = os.environ.get(AUTO_PROFILE_ENV, "on").strip().lower()  # on | always | off
        self.started_at: float | None = None
        self.child: tuple[int, int] | None = None  # (pid, pidfd) of the profile running now
        self.child_started: float | None = None
        self.taken = 0
        self.cpu_of: Callable[[int], float | None] = lambda pid: None  # a child the shim's reaper took

    def on_findings(self, findings: Sequence[Finding]) -> None:
        """Told of every finding recorded as new (shim.record.findings.LiveFindings)."""
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
        if not self._allowed(why):
            return False
        from jobwarden.osapi.tool import start_helper  # subprocess and dataclasses: never for an idle run

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
        self.started_at = self.child_started = now
        self.taken += 1
        self.log(f"automatic profile ({why}): `jobwarden profile` running as pid {self.child[0]}")
        return True

    def _allowed(self, why: str) -> bool:
        """Off, or inside a CPU quota that throttles (py-spy would be charged to the job's quota): not
        taken, and said once per interval."""
        if self.mode == "off":
            return False
        throttled = self.quota.throttled() if self.mode != "always" else None
        if throttled is None:
            return True
        self.started_at = self.monotonic()  # said once per interval, not at every finding
        self.log(f"automatic profile ({why}) not taken: {throttled}; {AUTO_PROFILE_ENV}=always takes it")
        self.note("auto-profile-skipped", rule=why, reason=throttled)
        return False

    def poll(self) -> None:
        """Forget the child once it ended (the shim's reaper collected it, or will), saying what it cost."""
        if self.child is not None and pidfds.has_exited(self.child[1]):
            pid, fd = self.child
            cpu_s = reap_measured(pid, fd)
            if cpu_s is None:
                cpu_s = self.cpu_of(pid)
            pidfds.close(fd)
            self.child = None
            self._said_cost(pid, cpu_s)

    def _said_cost(self, pid: int, cpu_s: float | None) -> None:
        wall_s = self.monotonic() - self.child_started if self.child_started is not None else None
        cost = f"{cpu_s:.2f} s of CPU" if cpu_s is not None else "CPU not measured"
        self.log(f"automatic profile (pid {pid}) ended: {cost}" + (f" in {wall_s:.1f} s" if wall_s else ""))
        self.note("auto-profile", pid=pid, cpu_s=cpu_s, wall_s=wall_s)

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
            cpu_s = reap_measured(pid, fd)
            self._said_cost(pid, cpu_s if cpu_s is not None else self.cpu_of(pid))
        except JobwardenError:
            pass
        finally:
            pidfds.close(fd)
            self.child = None


class SharedQuota:
    """The CPU quota the shim runs under, and so its children: the job's too when the CLI was started
    inside it (a container's --cpus, a Slurm step). Throttled: it throttled since the shim began."""

    def __init__(self, pid: int) -> None:
        self.cgroup: CpuCgroup | None = cpu_cgroup_of(pid)
        self.base: CpuStat | None = self._stat()

    def _stat(self) -> CpuStat | None:
        return self.cgroup.cpu_stat() if self.cgroup is not None else None

    def throttled(self) -> str | None:
        """Why a profile now would slow the job, or None."""
        stat = self._stat()
        if self.cgroup is None or self.cgroup.quota_cpus is None or stat is None:
            return None
        base = self.base or CpuStat(0, 0, 0)
        periods, throttled = stat.nr_periods - base.nr_periods, stat.nr_throttled - base.nr_throttled
        if throttled <= 0:
            return None
        return (
            f"the {self.cgroup.quota_cpus:g}-CPU quota the supervisor shares with the job "
            f"({self.cgroup.limiter}) throttled {throttled} of {periods} periods: "
            "py-spy's CPU would be the job's"
        )

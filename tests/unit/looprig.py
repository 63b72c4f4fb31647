"""One job, a real store in a temporary home, the fake OS (tests/fakeos.py) and a fake clock, and the real
supervisor over them: the rig of the unit tests that drive the loop and the run's transitions without
starting a process. Times are seconds since the rig was made, as the fake clock counts them."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

from jobwarden.clock import FakeClock
from jobwarden.control.lifecycle import request_stop
from jobwarden.joboptions import JobOptions
from jobwarden.model import JobSpec
from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.run.attempts import supervise_job
from jobwarden.shim.run.supervisor import Supervisor
from jobwarden.store import RunRecord, Store
from tests.fakeos import FakeJobOS
from tests.unit.test_procfs import CAPTURED_PROC_STAT, add_process, stat_line

BOOT_ID = "6c1e0b3f-2f7a-4b7e-9d51-0d2f1b7e8a11"  # this (fake) boot's id


def refuse_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may be started: a fork or spawn anywhere under the code tested fails the test."""

    def refused(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("a unit test of the loop started a process")

    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve"):
        monkeypatch.setattr(os, name, refused)
    monkeypatch.setattr(subprocess, "Popen", refused)


class Rig:
    """One job, its store, the fake OS and a supervisor over them."""

    def __init__(self, tmp_path: Path, **options: Any) -> None:
        self.home = tmp_path / "home"
        self.store = Store(self.home)
        opts = JobOptions(py_hooks=False, hang_timeout_s=0, **options)
        self.job_id, self.run_n = self.store.create_job(
            JobSpec(("python", "train.py"), "/", "train"), opts.to_json(), 1_700_000_000.0
        )
        self.proc = tmp_path / "proc"  # the shim's own /proc entry: its start time goes on record
        self.proc.mkdir()
        (self.proc / "stat").write_text(CAPTURED_PROC_STAT)
        (self.proc / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT_ID + "\n")
        add_process(self.proc, os.getpid(), stat_line(os.getpid(), "jobwarden"))
        self.procfs = ProcFS(self.proc)
        self.clock = FakeClock()
        self.fake = FakeJobOS(self.clock)
        job = self.store.job(self.job_id)
        self.sup = Supervisor(self.store, job, self.run_n, self.clock, self.procfs, jobos=self.fake)

    def launch(self) -> RunRecord:
        try:
            assert self.sup.launch(-1) == 0
        finally:
            self.sup.close()
        return self.store.run(self.job_id, self.run_n)

    def supervise(self, mode: str = "launch", n: int | None = None, report_fd: int = -1) -> int:
        """The shim's whole life (shim.run.attempts): every attempt and the restarts between them."""
        self.sup.close()  # supervise_job makes its own, one per attempt
        job = self.store.job(self.job_id)
        n = self.run_n if n is None else n
        return supervise_job(self.store, job, n, self.clock, self.procfs, report_fd, mode, self.fake)

    @property
    def main(self) -> int:
        return next(iter(self.fake.processes))  # the spawned job: the first fake process

    def latest(self) -> RunRecord:
        return self.store.run(self.job_id)

    def stop_at(self, seconds: float, grace_s: float) -> None:
        """`jobwarden stop --grace` (control.lifecycle): the request on the run it sees last, then SIGUSR1
        to the shim."""

        def stop() -> None:
            request_stop(self.store, self.job_id, self.latest().n, grace_s, self.clock.wall())
            self.fake.signal_shim(signal.SIGUSR1)

        self.fake.at(seconds, stop)

    def look_at(self, seconds: float, seen: list[RunRecord]) -> None:
        """What a `jobwarden status` would read at that moment: the latest run, as stored."""
        self.fake.at(seconds, lambda: seen.append(self.latest()))

    def live_in_proc(self, pid: int) -> None:
        """A fake process as /proc shows it, with the start time the fake tree holds it by."""
        add_process(self.proc, pid, stat_line(pid, "python", f22=1000 + pid))

"""`--after A` while A's supervisor is dead (shim.admission.queueing), on an injected /proc and a real store:
the waiting run waits while a process of A still runs, and is cancelled once nothing of A can succeed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.clock import FakeClock
from jobwarden.joboptions import JobOptions
from jobwarden.model import JobSpec, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import HOME_ENV, JOB_ID_ENV, RUN_ENV, STORE_ENV
from jobwarden.shim.admission.queueing import check_turn
from jobwarden.store import Store
from tests.unit.test_procfs import CAPTURED_PROC_STAT, add_process, stat_line

NOW = 1_700_000_000.0
SHIM, MAIN, WORKER = 300, 400, 401


class Jobs:
    """Job A (`prep`, running under shim 300, main process 400) and job B, which runs --after A."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = Store(tmp_path / "home")
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        (self.proc / "stat").write_text(CAPTURED_PROC_STAT)
        self.procfs = ProcFS(self.proc)
        self.a, _ = self.store.create_job(JobSpec(("prep",), "/", "prep"), JobOptions().to_json(), NOW)
        self.store.update_run(
            self.a, 1, state=JobState.RUNNING, shim_pid=SHIM, shim_start=10, pid=MAIN, pid_start=20
        )
        after = JobOptions(after=(self.a,)).to_json()
        self.b, _ = self.store.create_job(JobSpec(("train",), "/", "train"), after, NOW)

    def add(self, pid: int, start: int, marked: bool = True) -> None:
        home, store = str(self.store.layout.home), self.store.store_id
        env = {HOME_ENV: home, JOB_ID_ENV: str(self.a), RUN_ENV: "1", STORE_ENV: store} if marked else {}
        environ = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        add_process(self.proc, pid, stat_line(pid, "prep", f22=start), environ=environ)

    def end(self, pid: int) -> None:
        shutil.rmtree(self.proc / str(pid))

    def turn(self) -> tuple[bool, str, str]:
        turn = check_turn(self.store, self.store.job(self.b), 1, self.procfs, FakeClock())
        return turn.ready, turn.waiting, turn.cancelled


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    made = Jobs(tmp_path)
    yield made
    made.store.close()


def test_a_dependency_under_a_live_supervisor_is_waited_for(jobs: Jobs) -> None:
    jobs.add(SHIM, 10, marked=False)
    jobs.add(MAIN, 20)
    assert jobs.turn() == (False, "waiting for job 1 (prep) to succeed (--after): it is running", "")


def test_a_dependency_whose_supervisor_died_is_waited_for_while_a_process_of_it_runs(jobs: Jobs) -> None:
    jobs.add(MAIN, 20)  # no shim 300: it died, and nobody has recorded it lost yet
    lost = "waiting for job 1 (prep) to succeed (--after): it is lost (its supervisor died); its processes "
    assert jobs.turn() == (False, lost + "still run: `jobwarden adopt 1` records its end", "")
    jobs.add(WORKER, 21)
    jobs.end(MAIN)  # its main process ended unwatched; a worker of it still runs (found by its markers)
    assert jobs.turn()[1].startswith(lost)
    jobs.end(WORKER)
    ready, waiting, cancelled = jobs.turn()
    assert (ready, waiting) == (False, "")
    assert cancelled.startswith("job 1 (prep) was lost: its supervisor died and none of its processes runs")


def test_a_dependency_lost_in_its_restart_backoff_is_a_failed_one(jobs: Jobs) -> None:
    jobs.store.update_run(jobs.a, 1, state=JobState.FAILED, exit_code=3)
    n = jobs.store.new_run(jobs.a, JobState.RESTARTING, NOW)
    jobs.store.add_event(jobs.a, n, "restarting", NOW, after_run=1)
    jobs.store.update_run(jobs.a, n, shim_pid=SHIM, shim_start=10)  # and the shim is gone
    turn = check_turn(jobs.store, jobs.store.job(jobs.b), 1, jobs.procfs, FakeClock())
    assert turn.cancelled.startswith("job 1 (prep) was lost between runs: its supervisor died in a restart's")
    assert turn.remedy.startswith("`jobwarden adopt 1` makes that restart")

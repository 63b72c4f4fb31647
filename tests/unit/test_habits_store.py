"""The store's side of issue 21's habits: `@last`, names shared by live jobs, queues and their places, the
boot a run belongs to (read from an injected /proc), and the old databases still opening with it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.control.boot.reboot import RULE, current_boot_id, ended_by_reboot, mark_rebooted
from jobwarden.errors import JobNotFound
from jobwarden.joboptions import JobOptions
from jobwarden.model import EndReason, JobSpec, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NOW = 1_700_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as opened:
        yield opened


def new_job(store: Store, name: str, queue: str | None = None) -> int:
    options = JobOptions(queue=queue).to_json()
    job_id, _ = store.create_job(JobSpec(("true",), "/", name), options, NOW)
    return job_id


def fake_proc(tmp_path: Path, boot_id: str, btime: int = 1_700_000_500) -> ProcFS:
    root = tmp_path / "proc"
    (root / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text(f"{boot_id}\n")
    (root / "stat").write_text(f"cpu 1 2 3\nbtime {btime}\n")
    return ProcFS(root)


def test_at_last_is_the_newest_job_and_no_name_can_shadow_it(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.job("@last")
    new_job(store, "a")
    new_job(store, "b")
    assert store.job("@last").name == "b"


def test_namesakes_are_the_other_jobs_of_the_name_not_over(store: Store) -> None:
    first, second, third = (new_job(store, "train") for _ in range(3))
    store.update_run(first, 1, state=JobState.SUCCEEDED)
    assert store.unfinished_namesakes("train", third) == [second]
    assert store.unfinished_namesakes("other", third) == []


def test_a_queue_gives_its_places_first_come_first_served(store: Store) -> None:
    a, b, c = (new_job(store, name, queue="q") for name in "abc")
    assert store.take_queue_place("q", b, 1, NOW).taken is False  # a came first, and still waits
    assert store.take_queue_place("q", a, 1, NOW).taken is True
    waiting = store.take_queue_place("q", c, 1, NOW)
    assert not waiting.taken and waiting.holders == ((a, 1),) and waiting.ahead == 1
    assert waiting.describe() == "waiting for a place in queue 'q': 1 of 1 taken (job 1), 1 ahead in line"
    store.update_run(a, 1, state=JobState.SUCCEEDED)  # the place goes back with the run's end
    assert store.take_queue_place("q", c, 1, NOW).taken is False  # b is first in line
    assert store.take_queue_place("q", b, 1, NOW).taken is True
    store.set_queue_parallel("q", 2)
    assert store.take_queue_place("q", c, 1, NOW).taken is True
    assert [q.to_json() for q in store.queues()] == [{"name": "q", "parallel": 2, "running": 2, "waiting": 0}]


def test_the_boot_id_is_read_from_the_proc_it_is_given(tmp_path: Path) -> None:
    assert fake_proc(tmp_path, "1111-aaaa").boot_id() == "1111-aaaa"
    assert ProcFS(tmp_path / "nowhere").boot_id() is None


def test_a_live_run_of_another_boot_is_ended_by_the_reboot_once(store: Store, tmp_path: Path) -> None:
    procfs = fake_proc(tmp_path, "2222-now")
    job = new_job(store, "train")
    store.update_run(job, 1, state=JobState.RUNNING, boot_id="2222-now")
    assert not ended_by_reboot(procfs, store.run(job))  # this boot's: alive as far as a reboot goes
    store.update_run(job, 1, boot_id="1111-before")
    run = store.run(job)
    assert current_boot_id(procfs) == "2222-now" and ended_by_reboot(procfs, run)
    ended = mark_rebooted(store, procfs, store.job(job), run)
    assert (ended.state, ended.end_reason, ended.ended_at) == (
        JobState.FAILED,
        EndReason.REBOOT,
        1_700_000_500,
    )
    assert not ended_by_reboot(procfs, ended)
    mark_rebooted(store, procfs, store.job(job), run)  # a second look records nothing more
    assert [f.rule for _, f in store.findings(job, 1)] == [RULE]
    assert [e.kind for e in store.events(job, 1)].count("rebooted") == 1


def test_a_run_with_no_boot_on_record_is_never_taken_for_rebooted(store: Store, tmp_path: Path) -> None:
    """Runs recorded before boot ids were: nothing to compare with."""
    job = new_job(store, "old")
    store.update_run(job, 1, state=JobState.RUNNING)
    assert not ended_by_reboot(fake_proc(tmp_path, "3333"), store.run(job))


@pytest.mark.parametrize("fixture", ["jobwarden-v1.db", "jobwarden-v4.db"])
def test_old_databases_open_and_read_with_the_new_columns(tmp_path: Path, fixture: str) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shutil.copy(FIXTURES / fixture, home / "jobwarden.db")
    with Store(home) as store:
        jobs = store.jobs()
        assert jobs and all(job.rerun_of is None for job in jobs)
        run = store.run(jobs[0].id)
        assert (run.boot_id, run.kept) == (None, ())
        assert store.queues() == []


def test_a_new_run_after_another_is_taken_once(store: Store) -> None:
    """`resume` twice at once: the compare-and-set on the latest run lets one of them start it."""
    job = new_job(store, "svc")
    assert store.new_run_after(job, 1, JobState.STARTING, NOW) == 2
    assert store.new_run_after(job, 1, JobState.STARTING, NOW) is None  # run 1 is no longer the latest
    assert [r.n for r in store.runs(job)] == [1, 2]
    assert store.new_run_after(job, 2, JobState.STARTING, NOW) == 3


def test_a_run_being_stopped_when_the_machine_rebooted_stays_stopped(store: Store, tmp_path: Path) -> None:
    procfs = fake_proc(tmp_path, "2222-now")
    job = new_job(store, "svc")
    # `jobwarden stop` asked, the shim in its grace (stopping), then the reboot
    store.update_run(
        job, 1, state=JobState.STOPPING, boot_id="1111-before", stop_requested_at=NOW, stop_grace=60
    )
    ended = mark_rebooted(store, procfs, store.job(job), store.run(job))
    assert (ended.state, ended.end_reason) == (JobState.STOPPED, EndReason.REBOOT)
    [(_, finding)] = store.findings(job, 1)
    assert finding.rule == RULE and "while `jobwarden stop` ended it" in finding.summary
    assert finding.severity == "info" and "resume" not in finding.remedy

"""Every state transition of a run, driven through the real supervisor (shim.run.supervisor,
shim.run.attempts) and the real commands' code (control.lifecycle, control.boot.reboot) on the fake OS
(tests/fakeos.py) and a fake clock, each test asserting what the store holds afterwards. No process is
started; the whole file runs in seconds, so a change to a transition is checked at once. The real-process
tests (tests/integration/test_lifecycle.py, test_supervisor_loss.py, test_reboot.py...) stay the proof that
the OS behaves as the fake says.

Times are seconds since the job started, as the fake clock counts them."""

from __future__ import annotations

import fcntl
import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from jobwarden.control import lifecycle
from jobwarden.control.boot import reboot
from jobwarden.control.views.joblist import refresh
from jobwarden.errors import JobwardenError
from jobwarden.joboptions import JobOptions
from jobwarden.model import EndReason, JobSpec, JobState
from jobwarden.shim.admission.queueing import TURN_RETRY_S
from jobwarden.shim.run.attempts import supervise_job
from jobwarden.shim.run.starting import ADMIT_RETRY_S
from jobwarden.store import RunRecord
from tests.unit.looprig import BOOT_ID, Rig, refuse_processes

SIGKILL, SIGTERM = signal.SIGKILL, signal.SIGTERM
DEAD_SHIM = (999_999, 77)  # a supervisor's pid and start time that /proc no longer shows


@pytest.fixture(autouse=True)
def no_process_started(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_processes(monkeypatch)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.store.close()


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(**options: Any) -> Rig:
        made.append(Rig(tmp_path, **options))
        return made[-1]

    yield make
    for rig in made:
        rig.store.close()


def kinds(rig: Rig, n: int) -> list[str]:
    return [e.kind for e in rig.store.events(rig.job_id, n)]


def event(rig: Rig, n: int, kind: str) -> dict[str, Any]:
    [found] = [e.data for e in rig.store.events(rig.job_id, n) if e.kind == kind]
    return found


def runs(rig: Rig) -> list[RunRecord]:
    return rig.store.runs(rig.job_id)


# --- starting and ending by itself ----------------------------------------------------------------------


def test_starting_to_running_records_the_pid_the_shim_and_the_boot(rig: Rig) -> None:
    began = rig.clock.wall()
    rig.fake.attempts_exit((10, 0))
    seen: list[RunRecord] = []
    rig.look_at(1, seen)
    rig.supervise()
    [running] = seen
    assert running.state == JobState.RUNNING
    assert (running.pid, running.pid_start) == (rig.main, 1000 + rig.main)
    assert (running.shim_pid, running.boot_id, running.started_at) == (os.getpid(), BOOT_ID, began)
    assert event(rig, 1, "started")["pid"] == rig.main


def test_running_to_succeeded_when_the_job_exits_0(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(restart="on-failure")  # a success is never restarted by on-failure
    rig.fake.attempts_exit((7, 0))
    rig.supervise()
    [run] = runs(rig)
    assert (run.state, run.exit_code, run.end_reason) == (JobState.SUCCEEDED, 0, EndReason.EXITED)
    assert run.ended_at is not None and run.started_at is not None
    assert run.ended_at - run.started_at == 7.0
    assert event(rig, 1, "ended")["state"] == "succeeded"
    assert rig.fake.sent == [] and len(rig.fake.spawned) == 1


def test_running_to_failed_without_a_restart_policy(rig: Rig) -> None:
    rig.fake.attempts_exit((3, 2))
    rig.supervise()
    [run] = runs(rig)
    assert (run.state, run.exit_code, run.end_reason) == (JobState.FAILED, 2, EndReason.EXITED)
    assert "not-restarted" not in kinds(rig, 1)  # none was asked for: nothing to explain


def test_starting_to_failed_when_the_command_cannot_be_started(make_rig: Callable[..., Rig]) -> None:
    from jobwarden.osapi.process import SpawnError

    rig = make_rig(restart="always")
    rig.fake.spawn_error = SpawnError(2, "cannot execute python: No such file or directory")
    rig.supervise()
    [run] = runs(rig)  # it would fail the same way again: not restarted, even with --restart always
    assert (run.state, run.exit_code, run.end_reason) == (JobState.FAILED, 127, EndReason.SPAWN_FAILED)
    assert (
        "spawn-failed" in kinds(rig, 1) and "could not be started" in event(rig, 1, "not-restarted")["reason"]
    )


# --- restarts: the backoff and the limit ----------------------------------------------------------------


def test_a_failure_with_restart_waits_out_the_backoff_then_starts_the_next_attempt(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(restart="on-failure", max_restarts=3, restart_delay_s=5.0)
    rig.fake.attempts_exit((2, 3), (4, 0))
    seen: list[RunRecord] = []
    rig.look_at(4, seen)  # inside the backoff: attempt 1 ended at 2 s, attempt 2 starts at 7 s
    rig.supervise()
    first, second = runs(rig)
    assert (first.state, first.exit_code) == (JobState.FAILED, 3)
    [waiting] = seen
    assert (waiting.n, waiting.state, waiting.pid) == (2, JobState.RESTARTING, None)
    restarting = event(rig, 2, "restarting")
    assert (restarting["after_run"], restarting["delay_s"]) == (1, 5.0)
    assert rig.fake.spawned_at == [0.0, 7.0]  # the whole backoff, and no more
    assert second.started_at is not None and first.ended_at is not None
    assert second.started_at - first.ended_at == 5.0
    assert (second.state, second.exit_code) == (JobState.SUCCEEDED, 0)


def test_the_backoff_doubles_and_the_restart_limit_ends_the_job_failed(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(restart="on-failure", max_restarts=2, restart_delay_s=5.0)
    rig.fake.attempts_exit((2, 3), (2, 3), (2, 3), (2, 0))
    rig.supervise()
    assert [(r.n, r.state, r.exit_code) for r in runs(rig)] == [(n, JobState.FAILED, 3) for n in (1, 2, 3)]
    # ends at 2 s, +5 s; ends at 9 s, +10 s (two quick failures in a row); ends at 21 s: no fourth
    assert rig.fake.spawned_at == [0.0, 7.0, 19.0]
    assert [event(rig, n, "restarting")["delay_s"] for n in (2, 3)] == [5.0, 10.0]
    assert "--max-restarts 2 reached (3 attempts)" in event(rig, 3, "not-restarted")["reason"]


# --- stopping: the grace, SIGKILL, the backoff ----------------------------------------------------------


def test_a_stop_while_running_terminates_waits_the_grace_then_kills(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(restart="always")  # a stopped job is never restarted
    rig.fake.main_ignores = frozenset({SIGTERM})
    rig.stop_at(5, grace_s=10)
    seen: list[RunRecord] = []
    rig.look_at(10, seen)  # in the grace
    rig.supervise()
    (term_at, term), (kill_at, kill) = rig.fake.signals_to(rig.main)
    assert (term_at, term, kill) == (5.0, "SIGTERM", "SIGKILL") and 15.0 <= kill_at < 15.5
    [stopping] = seen
    assert (stopping.state, stopping.stop_grace) == (JobState.STOPPING, 10)
    [run] = runs(rig)
    assert (run.state, run.end_reason, run.signal, run.survivors) == (
        JobState.STOPPED,
        EndReason.STOPPED,
        "SIGKILL",
        [],
    )
    assert event(rig, 1, "stopping")["reason"] == "stopped"
    assert len(rig.fake.spawned) == 1  # [run] above: no second run either


def test_a_stop_during_the_restart_backoff_ends_it_stopped_and_never_restarts(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(restart="on-failure", restart_delay_s=3600.0)
    rig.fake.attempts_exit((2, 1))
    rig.stop_at(100, grace_s=10)  # `stop` sees run 2, restarting
    rig.supervise()
    first, second = runs(rig)
    assert first.state == JobState.FAILED
    assert (second.state, second.end_reason, second.started_at, second.pid) == (
        JobState.STOPPED,
        EndReason.STOPPED,
        None,
        None,
    )
    assert event(rig, 2, "ended")["state"] == "stopped"
    assert len(rig.fake.spawned) == 1 and rig.fake.elapsed() == 100.0  # the hour's backoff cut short


def test_a_stop_written_on_the_attempt_that_just_ended_stops_the_restart(
    make_rig: Callable[..., Rig],
) -> None:
    """`stop` read run 1 as it ended and wrote its request there; its SIGUSR1 reaches the shim in run 2's
    backoff. The request is run 2's to act on, or the stop was lost and the job ran on."""
    rig = make_rig(restart="on-failure", restart_delay_s=3600.0)
    rig.fake.at(2, lambda: lifecycle.request_stop(rig.store, rig.job_id, 1, 10.0, rig.clock.wall()))
    rig.fake.attempts_exit((2, 1))  # after the request: run 1 was still running when it was written
    rig.fake.at(50, lambda: rig.fake.signal_shim(signal.SIGUSR1))
    rig.supervise()
    first, second = runs(rig)
    assert (first.state, first.stop_requested_at) == (JobState.FAILED, rig.clock.wall() - 48)
    assert (second.state, second.end_reason, second.started_at) == (JobState.STOPPED, EndReason.STOPPED, None)
    assert len(rig.fake.spawned) == 1 and rig.fake.elapsed() == 50.0


def test_a_stop_of_an_ended_run_changes_nothing(rig: Rig) -> None:
    rig.fake.attempts_exit((3, 0))
    rig.supervise()
    result = lifecycle.stop(rig.home, rig.procfs, str(rig.job_id), None)
    assert (result.already_ended, result.run.state, result.survivors) == (True, JobState.SUCCEEDED, [])
    assert rig.store.run(rig.job_id, 1).stop_requested_at is None


def lost_in_backoff(rig: Rig) -> int:
    """Run 1 failed; its shim died waiting out the backoff before run 2, which never started."""
    rig.store.update_run(rig.job_id, 1, state=JobState.FAILED, exit_code=3, end_reason=EndReason.EXITED)
    n = rig.store.new_run(rig.job_id, JobState.RESTARTING, rig.clock.wall())
    rig.store.add_event(rig.job_id, n, "restarting", rig.clock.wall(), after_run=1, delay_s=3600.0)
    rig.store.update_run(
        rig.job_id, n, state=JobState.RESTARTING, shim_pid=DEAD_SHIM[0], shim_start=DEAD_SHIM[1]
    )
    return n


def test_a_stop_of_a_restart_whose_shim_died_in_the_backoff_calls_the_restart_off(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(restart="on-failure", restart_delay_s=3600.0)
    n = lost_in_backoff(rig)
    result = lifecycle.stop(rig.home, rig.procfs, str(rig.job_id), None)  # refresh: restarting -> lost
    run = rig.store.run(rig.job_id, n)
    assert (result.already_ended, run.state, run.end_reason) == (False, JobState.STOPPED, EndReason.STOPPED)
    assert kinds(rig, n)[-2:] == ["supervisor-lost", "ended"]
    # an `adopt` after it finds nothing to restart: the stop won the compare-and-set
    assert rig.supervise("restart", n) == 1 and rig.fake.spawned == []
    assert [r.n for r in runs(rig)] == [1, 2]


# --- a supervisor lost, and the one that takes over --------------------------------------------------


def running_under_a_dead_shim(rig: Rig) -> int:
    """Run 1 running, its job alive, its shim gone (killed): what `adopt` finds."""
    pid = rig.fake.fork(1, "python train.py")
    rig.live_in_proc(pid)
    rig.store.update_run(
        rig.job_id,
        1,
        state=JobState.RUNNING,
        pid=pid,
        pid_start=1000 + pid,
        started_at=rig.clock.wall(),
        shim_pid=DEAD_SHIM[0],
        shim_start=DEAD_SHIM[1],
        boot_id=BOOT_ID,
    )
    return pid


def test_a_dead_shim_makes_the_run_lost_and_adopt_supervises_it_to_its_end(rig: Rig) -> None:
    pid = running_under_a_dead_shim(rig)
    lost = refresh(rig.store, rig.procfs, rig.store.job(rig.job_id), rig.store.run(rig.job_id, 1))
    assert lost.state == JobState.LOST and event(rig, 1, "supervisor-lost")["shim_pid"] == DEAD_SHIM[0]
    seen: list[RunRecord] = []
    rig.look_at(2, seen)
    rig.fake.at(5, lambda: rig.fake.exit(pid, 0))
    assert rig.supervise("adopt") == 0
    [adopted] = seen
    assert (adopted.state, adopted.shim_pid) == (JobState.RUNNING, os.getpid())  # lost -> running
    assert event(rig, 1, "adopted") == {"pids": [pid], "main_alive": True}
    run = rig.store.run(rig.job_id, 1)
    assert (run.state, run.exit_code) == (JobState.SUCCEEDED, 0)
    assert rig.fake.spawned == []  # watched again, never started again


def test_adopt_with_nothing_alive_leaves_the_run_lost(rig: Rig) -> None:
    pid = running_under_a_dead_shim(rig)
    refresh(rig.store, rig.procfs, rig.store.job(rig.job_id), rig.store.run(rig.job_id, 1))
    rig.fake.exit(pid, 0)
    assert rig.supervise("adopt") == 1
    assert rig.store.run(rig.job_id, 1).state == JobState.LOST and "adopted" not in kinds(rig, 1)


def test_a_second_adopt_is_refused_while_one_holds_the_lock_and_once_the_run_is_taken(rig: Rig) -> None:
    pid = running_under_a_dead_shim(rig)
    lock = rig.store.layout.run_dir(rig.job_id, 1) / "adopt.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another `adopt` is under way
        with pytest.raises(JobwardenError, match="being adopted by another jobwarden adopt"):
            lifecycle.adopt(rig.home, rig.procfs, rig.job_id)
    finally:
        os.close(fd)
    refused: list[str] = []

    def adopt_again() -> None:  # the first adopt's shim supervises it now
        try:
            lifecycle.adopt(rig.home, rig.procfs, rig.job_id)
        except JobwardenError as err:
            refused.append(err.message)

    rig.fake.at(2, adopt_again)
    rig.fake.at(5, lambda: rig.fake.exit(pid, 0))
    refresh(rig.store, rig.procfs, rig.store.job(rig.job_id), rig.store.run(rig.job_id, 1))
    assert rig.supervise("adopt") == 0
    assert refused == [f"job {rig.job_id} is running: only a lost job (its supervisor died) can be adopted"]
    assert kinds(rig, 1).count("adopted") == 1


def test_adopt_makes_the_restart_a_shim_died_waiting_for_once(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(restart="on-failure", max_restarts=3, restart_delay_s=3600.0)
    n = lost_in_backoff(rig)
    refresh(rig.store, rig.procfs, rig.store.job(rig.job_id), rig.store.run(rig.job_id, n))
    rig.fake.attempts_exit((3, 0))
    assert rig.supervise("restart", n) == 0  # lost -> starting -> running -> succeeded, at once
    run = rig.store.run(rig.job_id, n)
    assert (run.state, run.exit_code, rig.fake.spawned_at) == (JobState.SUCCEEDED, 0, [0.0])
    assert kinds(rig, n).index("restart-adopted") < kinds(rig, n).index("started")
    assert rig.supervise("restart", n) == 1 and len(rig.fake.spawned) == 1  # a second one finds it taken


# --- a reboot, and resume -------------------------------------------------------------------------------


def ran_under_an_earlier_boot(rig: Rig, stopping: bool = False) -> None:
    """Run 1 was running (and being stopped, with `stopping`) when the machine went down."""
    rig.store.update_run(
        rig.job_id,
        1,
        state=JobState.STOPPING if stopping else JobState.RUNNING,
        pid=4242,
        pid_start=5,
        started_at=rig.clock.wall(),
        shim_pid=DEAD_SHIM[0],
        shim_start=DEAD_SHIM[1],
        boot_id="an-earlier-boot",
        stop_requested_at=rig.clock.wall() if stopping else None,
        stop_grace=10.0 if stopping else None,
    )


class ShimHere:
    """control.boot.reboot's new shim, supervising in this process on the fake OS: `start` answers with the
    first word the shim writes on its pipe (the pid), once the job has run to its end."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.started: list[int] = []

    def __call__(self, home: Path, mode: str) -> AbstractContextManager[ShimHere]:
        assert (home, mode) == (self.rig.home, "launch")
        return nullcontext(self)

    def start(self, job_id: int, run: int) -> dict[str, Any]:
        self.started.append(run)
        read, write = os.pipe()
        rig = self.rig
        supervise_job(rig.store, rig.store.job(job_id), run, rig.clock, rig.procfs, write, "launch", rig.fake)
        with os.fdopen(read) as answer:  # the shim closed its end once it had answered
            first: dict[str, Any] = json.loads(answer.readline())
            return first


def test_resume_ends_a_run_of_an_earlier_boot_failed_and_starts_the_next(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(restart="on-failure")
    rig.sup.close()
    ran_under_an_earlier_boot(rig)
    rig.fake.attempts_exit((3, 0))
    shims = ShimHere(rig)
    [resumed] = reboot.resume(rig.home, rig.procfs, shims)
    first, second = runs(rig)
    assert (first.state, first.end_reason) == (JobState.FAILED, EndReason.REBOOT)  # running -> failed
    assert [f.rule for _, f in rig.store.findings(rig.job_id, 1)] == [reboot.RULE]
    assert (resumed.new_run, resumed.pid, shims.started) == (2, rig.main, [2])
    assert event(rig, 2, "resumed") == {"after_run": 1, "reason": "the machine rebooted"}
    assert (second.state, second.exit_code) == (JobState.SUCCEEDED, 0)
    assert reboot.resume(rig.home, rig.procfs, shims) == [] and shims.started == [2]  # idempotent


def test_resume_leaves_a_run_that_was_being_stopped_stopped(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(restart="always")
    rig.sup.close()
    ran_under_an_earlier_boot(rig, stopping=True)
    shims = ShimHere(rig)
    [declined] = reboot.resume(rig.home, rig.procfs, shims)
    [run] = runs(rig)
    assert (run.state, run.end_reason) == (JobState.STOPPED, EndReason.REBOOT)  # stopping -> stopped
    assert declined.new_run is None and "it was being stopped" in declined.why
    assert "resume-declined" in kinds(rig, 1)
    assert reboot.resume(rig.home, rig.procfs, shims) == []
    assert shims.started == [] and rig.fake.spawned == []


def test_two_resumes_at_once_start_the_job_once(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(restart="on-failure")
    rig.sup.close()
    ran_under_an_earlier_boot(rig)
    rig.fake.attempts_exit((3, 0))
    shims = ShimHere(rig)
    theirs: list[reboot.Resumed] = []

    def racing(home: Path, mode: str) -> AbstractContextManager[ShimHere]:
        # the other resume runs to its end between this one's look at the runs and its compare-and-set
        theirs.extend(reboot.resume(home, rig.procfs, shims))
        return shims(home, mode)

    [mine] = reboot.resume(rig.home, rig.procfs, racing)
    [other] = theirs
    assert other.new_run == 2 and mine.new_run is None
    assert mine.why == "started again by another jobwarden resume, as run 2"
    assert shims.started == [2] and len(rig.fake.spawned) == 1
    assert [r.n for r in runs(rig)] == [1, 2]


# --- waiting its turn (--after) -------------------------------------------------------------------------


def after_a_running_job(make_rig: Callable[..., Rig]) -> tuple[Rig, int]:
    """The rig's job runs --after job `prep`, which is running under a live supervisor (this process)."""
    rig = make_rig(after=(2,))  # `prep`, made next, is job 2
    prep, _ = rig.store.create_job(JobSpec(("prep",), "/", "prep"), JobOptions().to_json(), rig.clock.wall())
    assert prep == 2
    shim_start = rig.procfs.stat(os.getpid()).start_time
    rig.store.update_run(prep, 1, state=JobState.RUNNING, shim_pid=os.getpid(), shim_start=shim_start)
    return rig, prep


def test_a_queued_run_starts_once_the_job_it_waits_for_succeeds(make_rig: Callable[..., Rig]) -> None:
    rig, prep = after_a_running_job(make_rig)
    rig.fake.at(3, lambda: rig.store.update_run(prep, 1, state=JobState.SUCCEEDED, exit_code=0))
    rig.fake.attempts_exit((2, 0))
    seen: list[RunRecord] = []
    rig.look_at(2, seen)
    rig.supervise()
    [queued] = seen
    assert (queued.state, queued.pid) == (JobState.QUEUED, None)
    assert queued.queued_reason == "waiting for job 2 (prep) to succeed (--after): it is running"
    [started] = rig.fake.spawned_at  # queued -> starting -> running at its next look
    assert 3.0 <= started <= 3.0 + TURN_RETRY_S
    run = rig.store.run(rig.job_id, 1)
    assert (run.state, run.queued_reason, run.exit_code) == (JobState.SUCCEEDED, None, 0)


def test_a_queued_run_is_cancelled_when_the_job_it_waits_for_fails(make_rig: Callable[..., Rig]) -> None:
    rig, prep = after_a_running_job(make_rig)
    rig.fake.at(3, lambda: rig.store.update_run(prep, 1, state=JobState.FAILED, exit_code=1))
    rig.supervise()
    run = rig.store.run(rig.job_id, 1)
    assert (run.state, run.end_reason, run.started_at) == (JobState.FAILED, EndReason.DEPENDENCY_FAILED, None)
    assert [f.rule for _, f in rig.store.findings(rig.job_id, 1)] == ["dependency-failed"]
    assert rig.fake.spawned == []


def test_a_stop_while_queued_ends_the_run_stopped_before_it_starts(make_rig: Callable[..., Rig]) -> None:
    rig, _ = after_a_running_job(make_rig)
    rig.stop_at(5, grace_s=10)
    rig.supervise()
    run = rig.store.run(rig.job_id, 1)
    assert (run.state, run.end_reason, run.started_at) == (JobState.STOPPED, EndReason.STOPPED, None)
    assert event(rig, 1, "ended")["state"] == "stopped"
    assert rig.fake.spawned == [] and rig.fake.elapsed() == 5.0


# --- waiting for a GPU (shim.admission.resources) ------------------------------------------------


def test_a_run_queued_for_a_busy_gpu_claims_it_once_free_and_releases_it_at_its_end(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from jobwarden.probes import fakenvml

    nvml = tmp_path / "nvml.json"
    fakenvml.write_state(nvml, {"devices": [fakenvml.device(0)]})
    fakenvml.hold(nvml, 0, 77, 4 << 30)  # a stray process holds the only GPU
    monkeypatch.setenv(fakenvml.FAKE_NVML_ENV, str(nvml))
    rig = make_rig(gpus=1)
    rig.fake.at(5, lambda: fakenvml.release(nvml, 77))
    rig.fake.attempts_exit((3, 0))
    seen: list[RunRecord] = []
    rig.look_at(1, seen)
    claims: list[dict[int, tuple[int, int]]] = []
    rig.fake.at(7, lambda: claims.append(rig.store.gpu_claims()))
    rig.supervise()
    [queued] = seen
    assert queued.state == JobState.QUEUED and queued.queued_reason is not None
    assert queued.queued_reason.startswith("waiting for 1 free GPU: GPU 0 held by pid 77")
    assert event(rig, 1, "gpus-claimed") == {"gpus": [0]}
    [started] = rig.fake.spawned_at  # queued -> starting at its next look once the GPU is free
    assert 5.0 <= started <= 5.0 + ADMIT_RETRY_S
    assert claims == [{0: (rig.job_id, 1)}]  # held while it runs
    run = rig.store.run(rig.job_id, 1)
    assert (run.state, run.exit_code, rig.store.gpu_claims()) == (JobState.SUCCEEDED, 0, {})


# --- the engine's stop ----------------------------------------------------------------------------------


def test_an_engine_stop_kills_within_the_engines_budget_and_is_never_restarted(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobwarden.probes import slurm

    monkeypatch.setattr(slurm, "job_state", lambda env, t: slurm.SlurmJobState("CANCELLED", "None", "X"))
    rig = make_rig(engine="slurm", engine_budget_s=20.0, grace_s=60.0, restart="always")
    rig.fake.main_ignores = frozenset({SIGTERM})
    rig.fake.at(4, lambda: rig.fake.signal_shim(SIGTERM))  # scancel: relayed by the CLI
    rig.supervise()
    (term_at, term), (kill_at, kill) = rig.fake.signals_to(rig.main)
    # the grace is what the budget leaves: 20 s less a 3 s margin, not the 60 s asked for
    assert (term_at, term, kill) == (4.0, "SIGTERM", "SIGKILL") and 21.0 <= kill_at < 21.5
    [run] = runs(rig)
    assert (run.state, run.end_reason, run.signal) == (JobState.STOPPED, EndReason.ENGINE_STOP, "SIGKILL")
    assert event(rig, 1, "stopping")["reason"] == "engine-stop"
    assert event(rig, 1, "engine-state")["state"] == "CANCELLED"
    assert len(rig.fake.spawned) == 1  # [run] above: no second run either

"""The supervising loop's decisions on a fake OS (tests/fakeos.py) and a fake clock: when it signals what,
how a run ends, what it records. No process is started; a real store in a temporary home records it all.
Times below are seconds since the job started, as the fake clock counts them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden.errors import StoreError
from jobwarden.model import EndReason, JobState
from jobwarden.shim.run.attempts import supervise_job
from jobwarden.shim.watch.diagnosis import Verdict
from jobwarden.store import RunRecord
from tests.unit.looprig import Rig, refuse_processes

SIGKILL, SIGTERM = signal.SIGKILL, signal.SIGTERM


@pytest.fixture(autouse=True)
def no_process_started(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_processes(monkeypatch)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.store.close()


def test_stop_sends_sigterm_and_the_job_ends_within_the_grace(rig: Rig) -> None:
    rig.stop_at(5, grace_s=10)
    run = rig.launch()
    assert rig.fake.signals_to(rig.main) == [(5.0, "SIGTERM")]
    assert (run.state, run.end_reason, run.signal) == (JobState.STOPPED, EndReason.STOPPED, "SIGTERM")


def test_a_job_that_ignores_sigterm_is_killed_when_the_grace_ends(rig: Rig) -> None:
    rig.fake.main_ignores = frozenset({SIGTERM})
    rig.stop_at(5, grace_s=10)
    run = rig.launch()
    (term_at, term), (kill_at, kill) = rig.fake.signals_to(rig.main)
    assert (term, kill) == ("SIGTERM", "SIGKILL")
    assert term_at == 5.0 and 15.0 <= kill_at < 15.5  # the whole grace, and not much more
    assert (run.state, run.signal, run.survivors) == (JobState.STOPPED, "SIGKILL", [])


def test_a_second_stop_with_force_cuts_a_long_grace_short(rig: Rig) -> None:
    rig.fake.main_ignores = frozenset({SIGTERM})
    rig.stop_at(5, grace_s=3600)
    rig.stop_at(8, grace_s=0)  # stop --force
    rig.launch()
    (term_at, _), (kill_at, kill) = rig.fake.signals_to(rig.main)
    assert term_at == 5.0 and kill == "SIGKILL" and 8.0 <= kill_at < 8.5


def test_a_later_stop_with_a_longer_grace_never_extends_the_first(rig: Rig) -> None:
    rig.fake.main_ignores = frozenset({SIGTERM})
    rig.stop_at(5, grace_s=10)
    rig.stop_at(8, grace_s=3600)
    rig.launch()
    assert 15.0 <= rig.fake.signals_to(rig.main)[-1][0] < 15.5


def test_a_newcomer_forked_during_the_grace_is_terminated_too(rig: Rig) -> None:
    rig.fake.main_ignores = frozenset({SIGTERM})
    rig.stop_at(5, grace_s=10)
    rig.fake.at(7, lambda: rig.fake.fork(rig.main, "python worker.py", ignores=[SIGTERM]))
    rig.launch()
    worker = max(rig.fake.processes)
    assert [name for _, name in rig.fake.signals_to(worker)] == ["SIGTERM", "SIGKILL"]
    assert not rig.fake.processes[worker].alive


def test_timeout_ends_the_run_as_failed(tmp_path: Path) -> None:
    rig = Rig(tmp_path, timeout_s=30.0)
    run = rig.launch()
    assert rig.fake.signals_to(rig.main) == [(30.0, "SIGTERM")]
    assert (run.state, run.end_reason) == (JobState.FAILED, EndReason.TIMEOUT)
    rig.store.close()


@pytest.mark.parametrize(("on_hang", "restart"), [("restart", True), ("stop", False)])
def test_a_hang_ends_the_run_and_asks_for_a_restart_only_with_on_hang_restart(
    tmp_path: Path, on_hang: str, restart: bool
) -> None:
    rig = Rig(tmp_path, on_hang=on_hang)
    rig.fake.verdict_at(20, Verdict("hang", ()))
    run = rig.launch()
    [(at, name)] = rig.fake.signals_to(rig.main)
    assert name == "SIGTERM" and 20.0 <= at < 21.5  # judged at the first tick past its moment
    assert (run.state, run.end_reason, rig.sup.state.restart_after_hang) == (
        JobState.FAILED,
        EndReason.HUNG,
        restart,
    )
    assert [e.kind for e in rig.store.events(rig.job_id, rig.run_n) if e.kind == "hung"] == ["hung"]
    rig.store.close()


def test_a_hang_with_on_hang_dump_leaves_the_job_running(tmp_path: Path) -> None:
    rig = Rig(tmp_path, on_hang="dump")
    rig.fake.verdict_at(20, Verdict("hang", ()))
    rig.fake.at(60, lambda: rig.fake.exit(rig.main, 0))
    run = rig.launch()
    assert rig.fake.sent == []
    assert (run.state, run.exit_code) == (JobState.SUCCEEDED, 0)
    rig.store.close()


def test_a_worker_death_is_judged_and_supervision_goes_on_while_main_lives(rig: Rig) -> None:
    worker: list[int] = []
    rig.fake.at(2, lambda: worker.append(rig.fake.fork(rig.main, "python -c worker")))
    rig.fake.at(5, lambda: setattr(rig.fake.processes[worker[0]], "status", SIGKILL))
    rig.fake.at(10, lambda: rig.fake.exit(rig.main, 0))
    run = rig.launch()
    [death] = rig.fake.deaths_judged[:1]
    assert (death.pid, death.status) == (worker[0], SIGKILL)
    assert rig.fake.sent == []  # a worker's death ends nothing by itself
    assert run.ended_at is not None and run.started_at is not None
    assert run.ended_at - run.started_at == pytest.approx(10, abs=1)
    assert (run.state, run.exit_code) == (JobState.SUCCEEDED, 0)


def test_main_ending_with_orphans_left_records_and_terminates_them(rig: Rig) -> None:
    orphan: list[int] = []
    rig.fake.at(1, lambda: orphan.append(rig.fake.fork(rig.main, "python data_server.py")))
    rig.fake.at(3, lambda: rig.fake.exit(rig.main, 0))
    run = rig.launch()
    assert run.orphans_left == [{"pid": orphan[0], "cmdline": "python data_server.py"}]
    assert [name for _, name in rig.fake.signals_to(orphan[0])] == ["SIGTERM"]
    assert (run.state, run.exit_code, run.survivors) == (JobState.SUCCEEDED, 0, [])


def test_multiprocessing_helpers_get_time_to_end_by_themselves(rig: Rig) -> None:
    tracker: list[int] = []
    cmd = "python -c from multiprocessing.resource_tracker import main;main(5)"
    rig.fake.at(1, lambda: tracker.append(rig.fake.fork(rig.main, cmd)))
    rig.fake.at(3, lambda: rig.fake.exit(rig.main, 0))
    rig.fake.at(3.5, lambda: rig.fake.exit(tracker[0], 0))  # its pipe closed: it ends on its own
    run = rig.launch()
    assert run.orphans_left == [] and rig.fake.sent == []


def test_a_lost_store_while_reading_the_stop_request_does_not_end_supervision(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = rig.store.run

    def lost(*args: Any, **kwargs: Any) -> RunRecord:
        raise StoreError("database disk image is malformed")

    rig.fake.at(
        5, lambda: (monkeypatch.setattr(rig.store, "run", lost), rig.fake.signal_shim(signal.SIGUSR1))
    )
    rig.fake.at(8, lambda: monkeypatch.setattr(rig.store, "run", real_run))
    rig.fake.at(20, lambda: rig.fake.exit(rig.main, 0))
    run = rig.launch()
    assert rig.fake.sent == []
    assert (run.state, run.exit_code) == (JobState.SUCCEEDED, 0)
    assert run.ended_at is not None and run.started_at is not None
    assert run.ended_at - run.started_at == pytest.approx(20, abs=1)


def test_sigterm_to_the_shim_stops_the_job(rig: Rig) -> None:
    rig.fake.at(4, lambda: rig.fake.signal_shim(SIGTERM))
    run = rig.launch()
    assert rig.fake.signals_to(rig.main) == [(4.0, "SIGTERM")]
    assert (run.state, run.end_reason) == (JobState.STOPPED, EndReason.STOPPED)


def test_a_process_the_shim_may_not_signal_is_reported_as_a_survivor(rig: Rig) -> None:
    rig.stop_at(5, grace_s=10)
    rig.fake.at(1, lambda: rig.fake.fork(rig.main, "sudo helper"))
    rig.fake.at(2, lambda: setattr(rig.fake.processes[max(rig.fake.processes)], "denied", True))
    run = rig.launch()
    [survivor] = run.survivors
    assert survivor.pid == max(rig.fake.processes) and "another user" in survivor.reason


def test_on_hang_restart_starts_a_new_attempt_that_runs_to_its_end(tmp_path: Path) -> None:
    rig = Rig(tmp_path, on_hang="restart", restart_delay_s=5.0)
    rig.fake.verdict_at(20, Verdict("hang", ()))

    def second_attempt_succeeds() -> None:
        if len(rig.fake.spawned) == 2:
            rig.fake.exit(max(rig.fake.processes), 0)

    for t in range(30, 60):
        rig.fake.at(t, second_attempt_succeeds)
    rig.sup.close()  # supervise_job makes its own, one per attempt
    job = rig.store.job(rig.job_id)
    supervise_job(rig.store, job, rig.run_n, rig.clock, rig.sup.state.procfs, -1, "launch", rig.fake)
    first, second = rig.store.run(rig.job_id, 1), rig.store.run(rig.job_id, 2)
    assert (first.state, first.end_reason) == (JobState.FAILED, EndReason.HUNG)
    assert (second.state, second.exit_code) == (JobState.SUCCEEDED, 0)
    assert len(rig.fake.spawned) == 2
    rig.store.close()


def test_an_engine_stop_gives_the_group_record_slurms_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shim asks Slurm why only after the end is recorded: the group's records still carry it."""
    from jobwarden.control.views.group import group_view
    from jobwarden.probes import slurm
    from jobwarden.text.group import verdict_line

    monkeypatch.setattr(slurm, "job_state", lambda env, t: slurm.SlurmJobState("TIMEOUT", "TimeLimit", "X"))
    groups = tmp_path / "groups"
    rig = Rig(tmp_path, engine="slurm", engine_budget_s=10.0, group="g", group_dir=str(groups), rank=0)
    rig.fake.at(4, lambda: rig.fake.signal_shim(SIGTERM))
    try:
        run = rig.launch()
    finally:
        rig.store.close()
    assert run.end_reason == EndReason.ENGINE_STOP
    view = group_view(tmp_path / "home", "g", None, str(groups))
    assert "stopped by the engine (TIMEOUT)" in verdict_line(view)


def test_an_engine_stop_as_an_attempt_ends_is_not_lost_to_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM from the engine while the shim decides on a restart: the next attempt never starts."""
    from jobwarden.rules import retry

    rig = Rig(tmp_path, engine="slurm", engine_budget_s=10.0, restart="on-failure", restart_delay_s=5.0)
    rig.fake.at(3, lambda: rig.fake.exit(rig.main, 1))
    decide = retry.decide

    def engine_stop_meanwhile(*args: Any) -> Any:
        rig.fake.signal_shim(SIGTERM)  # relayed by the CLI: in the ended attempt's wakeup fd
        return decide(*args)

    monkeypatch.setattr(retry, "decide", engine_stop_meanwhile)
    rig.sup.close()
    supervise_job(
        rig.store,
        rig.store.job(rig.job_id),
        rig.run_n,
        rig.clock,
        rig.sup.state.procfs,
        -1,
        "launch",
        rig.fake,
    )
    first, second = rig.store.run(rig.job_id, 1), rig.store.run(rig.job_id, 2)
    assert (first.state, second.state, second.end_reason) == (
        JobState.FAILED,
        JobState.STOPPED,
        EndReason.ENGINE_STOP,
    )
    assert len(rig.fake.spawned) == 1
    rig.store.close()


def _lost_in_backoff(rig: Rig) -> int:
    """Run 1 failed; its shim died waiting out the backoff before run 2, which never started."""
    rig.sup.close()  # supervise_job makes its own
    rig.store.update_run(rig.job_id, 1, state=JobState.FAILED, exit_code=3, end_reason=EndReason.EXITED)
    n = rig.store.new_run(rig.job_id, JobState.RESTARTING, rig.clock.wall())
    rig.store.add_event(rig.job_id, n, "restarting", rig.clock.wall(), after_run=1, delay_s=3600.0)
    rig.store.update_run(rig.job_id, n, state=JobState.LOST, shim_pid=1, shim_start=1)
    rig.store.add_event(rig.job_id, n, "supervisor-lost", rig.clock.wall(), shim_pid=1)
    return n


def test_adopt_makes_the_restart_a_lost_shim_was_waiting_for_counting_the_attempts_before(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, restart="on-failure", max_restarts=1, restart_delay_s=3600.0)
    n = _lost_in_backoff(rig)
    rig.fake.at(3, lambda: rig.fake.exit(rig.main, 4))
    job = rig.store.job(rig.job_id)
    code = supervise_job(rig.store, job, n, rig.clock, rig.sup.state.procfs, -1, "restart", rig.fake)
    run = rig.store.run(rig.job_id, n)
    # lost -> starting -> running -> failed, at once (no hour of backoff): and no run 3, as
    # --max-restarts 1 was spent on this run
    assert (code, run.state, run.exit_code, len(rig.fake.spawned)) == (0, JobState.FAILED, 4, 1)
    assert [r.n for r in rig.store.runs(rig.job_id)] == [1, 2]
    kinds = [e.kind for e in rig.store.events(rig.job_id, n)]
    assert kinds.index("restart-adopted") < kinds.index("started") and "not-restarted" in kinds
    rig.store.close()


def test_a_restart_taken_over_by_another_shim_is_not_made_twice(tmp_path: Path) -> None:
    rig = Rig(tmp_path, restart="always", restart_delay_s=3600.0)
    n = _lost_in_backoff(rig)
    rig.store.update_run(rig.job_id, n, state=JobState.RUNNING)  # another adopt came first
    job = rig.store.job(rig.job_id)
    assert supervise_job(rig.store, job, n, rig.clock, rig.sup.state.procfs, -1, "restart", rig.fake) == 1
    assert rig.fake.spawned == [] and [r.n for r in rig.store.runs(rig.job_id)] == [1, 2]
    rig.store.close()

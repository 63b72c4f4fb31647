"""The shim's record of its run: the final columns from a wait status, and writes that a full disk or a
refusing store never turns into a lost event."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.clock import FakeClock
from jobwarden.errors import StoreError
from jobwarden.model import EndReason, JobSpec, JobState, Survivor
from jobwarden.shim.record.recorder import RunRecorder, end_fields
from jobwarden.store import Store
from jobwarden.store.logfiles import LogWatcher

NOW = 1_700_000_000.0


def exited(code: int) -> int:
    return code << 8  # the wait status of a normal exit


def killed(sig: signal.Signals) -> int:
    return int(sig)


@pytest.mark.parametrize(
    ("status", "stop", "expected"),
    [
        (exited(0), None, (JobState.SUCCEEDED, EndReason.EXITED, 0, None)),
        (exited(3), None, (JobState.FAILED, EndReason.EXITED, 3, None)),
        (killed(signal.SIGKILL), None, (JobState.FAILED, EndReason.SIGNALLED, None, "SIGKILL")),
        (killed(signal.SIGTERM), EndReason.STOPPED, (JobState.STOPPED, EndReason.STOPPED, None, "SIGTERM")),
        (killed(signal.SIGTERM), EndReason.TIMEOUT, (JobState.FAILED, EndReason.TIMEOUT, None, "SIGTERM")),
        (exited(0), EndReason.HUNG, (JobState.FAILED, EndReason.HUNG, 0, None)),
        (-1, None, (JobState.LOST, EndReason.UNKNOWN, None, None)),
    ],
)
def test_end_fields(
    status: int, stop: EndReason | None, expected: tuple[JobState, EndReason, int | None, str | None]
) -> None:
    fields = end_fields(status, stop, NOW)
    assert (fields["state"], fields["end_reason"], fields["exit_code"], fields["signal"]) == expected
    assert fields["ended_at"] == NOW
    assert fields["wait_status"] == (status if status >= 0 else None)


def test_a_main_process_that_ended_unseen_is_lost_with_the_reason() -> None:
    fields = end_fields(-1, None, NOW)
    assert "exit status is unknown" in fields["error"]


class Room:
    """The free space under the log, as the test sets it."""

    free = 10 << 30


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as s:
        yield s


def recorder(store: Store, monkeypatch: pytest.MonkeyPatch) -> tuple[RunRecorder, Room, int]:
    job_id, run = store.create_job(JobSpec(("true",), "/", "t"), {}, NOW)
    logs = LogWatcher(store.layout.output_log(job_id, run), store.layout.output_index(job_id, run))
    room = Room()
    monkeypatch.setattr(logs, "free_bytes", lambda: room.free)
    return RunRecorder(store, job_id, run, logs, FakeClock(wall_start=NOW)), room, job_id


def kinds(store: Store, job_id: int) -> list[str]:
    return [e.kind for e in store.events(job_id, 1)]


def test_a_disk_full_episode_is_recorded_once_each_way(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rec, room, job_id = recorder(store, monkeypatch)
    rec.check_disk(NOW)
    room.free = 4096
    rec.check_disk(NOW + 1)
    rec.check_disk(NOW + 2)
    room.free = 10 << 30
    rec.check_disk(NOW + 3)
    assert [k for k in kinds(store, job_id) if k.startswith("disk")] == ["disk-full", "disk-ok"]


def test_events_the_store_refused_wait_for_it(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rec, room, job_id = recorder(store, monkeypatch)
    add_event = store.add_event

    def refuse(*args: object, **kwargs: object) -> None:
        raise StoreError("database or disk is full")

    monkeypatch.setattr(store, "add_event", refuse)
    room.free = 4096
    rec.check_disk(NOW)
    assert rec.event("finding", NOW, rule="x") is False
    monkeypatch.setattr(store, "add_event", add_event)
    room.free = 10 << 30
    rec.check_disk(NOW + 1)
    assert [k for k in kinds(store, job_id) if k.startswith("disk")] == ["disk-full", "disk-ok"]


def test_the_end_lands_with_its_survivors(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rec, _, job_id = recorder(store, monkeypatch)
    survivor = Survivor(os.getpid(), "python t.py", "in D state")
    rec.end(end_fields(exited(0), None, NOW), [{"pid": 7, "cmdline": "sleep 9"}], [survivor])
    run = store.run(job_id)
    assert (run.state, run.exit_code) == (JobState.SUCCEEDED, 0)
    assert run.orphans_left == [{"pid": 7, "cmdline": "sleep 9"}]
    assert run.survivors == [survivor]
    assert kinds(store, job_id)[-1] == "ended"


def test_writes_the_lock_refuses_wait_in_order_with_their_own_times(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, _, job_id = recorder(store, monkeypatch)
    other = sqlite3.connect(store.layout.database, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        began = time.monotonic()
        assert rec.event("finding", NOW + 1, rule="first") is True  # kept, not lost
        assert rec.event("finding", NOW + 2, rule="second") is True
        assert time.monotonic() - began < 5.0  # the loop was not held up (the store waits 60 s)
        assert "finding" not in kinds(store, job_id)
        assert rec.flush() is False  # still locked
        other.execute("COMMIT")
    finally:
        other.close()
    assert isinstance(rec.clock, FakeClock)
    rec.clock.advance(1.0)  # past the pause after a refusal, when nothing asks the store again
    assert rec.flush() is True
    found = [(e.at, e.data.get("rule")) for e in store.events(job_id, 1) if e.kind == "finding"]
    assert found == [(NOW + 1, "first"), (NOW + 2, "second")]

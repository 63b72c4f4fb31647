"""The store: a private home, a versioned SQLite schema, and every read and write through `Store`."""

from __future__ import annotations

import select
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden import config
from jobwarden.errors import JobNotFound, StoreCorrupt, StoreError
from jobwarden.joboptions import JobOptions
from jobwarden.model import Finding, JobSpec, JobState, ProcessEnd, ProcessSnapshot, Ranks, Survivor
from jobwarden.observations import Frame, ProcessStack, ThreadStack
from jobwarden.store import Store
from jobwarden.store.db import translate
from jobwarden.store.schema import LATEST

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NOW = 1_700_000_000.0


def spec(name: str = "train.py", **changes: object) -> JobSpec:
    fields: dict[str, object] = {
        "command": ("python", "train.py", "--lr", "3e-4"),
        "cwd": "/home/ana/exp",
        "name": name,
        "env": {},
        **changes,
    }
    return JobSpec(**fields)  # type: ignore[arg-type]


def snap(
    pid: int, start: int, *, ppid: int = 1, rss: int = 1 << 20, cpu: float | None = 50.0
) -> ProcessSnapshot:
    return ProcessSnapshot(
        pid=pid,
        ppid=ppid,
        start_time=start,
        state="S",
        cmdline=f"python w{pid}",
        rss_bytes=rss,
        cpu_percent=cpu,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def schema_version(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "state" / "jobwarden"


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
    with Store(home) as s:
        yield s


# --- the home and the database file ---------------------------------------------------------------


def test_a_new_home_is_private(home: Path) -> None:
    with Store(home) as s:
        s.create_job(spec(), {}, NOW)
    assert mode(home) == 0o700
    assert mode(home / "jobwarden.db") == 0o600


def test_a_too_open_home_is_made_private(home: Path) -> None:
    home.mkdir(parents=True, mode=0o755)
    home.chmod(0o755)
    Store(home).close()
    assert mode(home) == 0o700


def test_the_wal_file_is_as_private_as_the_database(store: Store, home: Path) -> None:
    store.create_job(spec(), {}, NOW)
    wal = home / "jobwarden.db-wal"
    assert wal.exists()
    assert mode(wal) & 0o077 == 0


def test_run_directories_are_private(store: Store, home: Path) -> None:
    job_id, run = store.create_job(spec(), {}, NOW)
    run_dir = home / "jobs" / str(job_id) / f"run-{run}"
    assert run_dir.is_dir()
    assert mode(run_dir) == mode(run_dir.parent) == 0o700


def test_a_new_database_is_at_the_latest_schema_in_wal_mode(store: Store, home: Path) -> None:
    db = home / "jobwarden.db"
    assert schema_version(db) == LATEST
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_reopening_does_not_migrate_again(home: Path) -> None:
    with Store(home) as s:
        job_id, _ = s.create_job(spec(), {}, NOW)
    with Store(home) as s:
        assert s.job(job_id).name == "train.py"
    assert schema_version(home / "jobwarden.db") == LATEST


def test_a_home_that_is_a_file_is_a_store_error_with_a_remedy(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "home"
    not_a_dir.write_text("oops")
    with pytest.raises(StoreError) as info:
        Store(not_a_dir)
    assert str(not_a_dir) in info.value.message
    assert "JOBWARDEN_HOME" in info.value.remedy


def test_a_corrupt_database_is_reported_and_left_untouched(home: Path) -> None:
    home.mkdir(parents=True, mode=0o700)
    db = home / "jobwarden.db"
    garbage = b"\x89PNG not a database at all \x00\xff" * 200
    db.write_bytes(garbage)
    before = db.stat()
    with pytest.raises(StoreCorrupt) as info:
        Store(home)
    assert isinstance(info.value, StoreError)
    assert str(db) in info.value.message
    assert "move it aside" in info.value.remedy
    assert f"mv {db} " in info.value.remedy
    assert db.read_bytes() == garbage
    assert db.stat().st_mtime_ns == before.st_mtime_ns
    assert not (home / "jobwarden.db.corrupt").exists()


def test_a_database_from_a_newer_jobwarden_is_refused(home: Path) -> None:
    home.mkdir(parents=True, mode=0o700)
    db = home / "jobwarden.db"
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.close()
    with pytest.raises(StoreError) as info:
        Store(home)
    assert f"schema {LATEST + 1}" in info.value.message
    assert "upgrade jobwarden" in info.value.remedy
    assert schema_version(db) == LATEST + 1


# --- migrations: the checked-in v1 database must keep opening ---------------------------------------


@pytest.fixture
def v1_home(tmp_path: Path) -> Path:
    fixture = FIXTURES / "jobwarden-v1.db"
    assert schema_version(fixture) == 1, "the fixture must stay a v1 database: never regenerate it newer"
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shutil.copyfile(fixture, home / "jobwarden.db")
    return home


def test_the_v1_fixture_is_one_self_contained_file() -> None:
    assert (FIXTURES / "jobwarden-v1.db").is_file()
    assert not list(FIXTURES.glob("jobwarden-v1.db-*"))


def test_a_v1_database_is_migrated_to_the_latest_schema(v1_home: Path) -> None:
    Store(v1_home).close()
    assert schema_version(v1_home / "jobwarden.db") == LATEST


def test_a_v1_job_run_and_events_read_back_after_migration(v1_home: Path) -> None:
    with Store(v1_home) as s:
        job = s.job("train.py")
        assert (job.id, job.command, job.cwd) == (1, ("python", "train.py", "--epochs", "3"), "/home/ana/exp")
        assert job.created_at == 1700000000.0
        assert job.options == JobOptions(timeout_s=None, grace_s=10.0)  # stored before version 1
        assert job.env == {"HF_TOKEN": "hf_v1_secret_token"}
        run = s.run(job.id)
        assert (run.n, run.state, run.exit_code, run.end_reason) == (1, JobState.FAILED, 1, "exited")
        assert (run.pid, run.pid_start, run.wait_status) == (4101, 550003, 256)
        assert run.ended_at == 1700003600.25
        assert [e.kind for e in s.events(job.id)] == ["created", "started", "exited"]
        assert s.events(job.id, 1)[1].data == {"pid": 4101}


def test_v2_columns_of_a_migrated_v1_run_have_sane_defaults(v1_home: Path) -> None:
    with Store(v1_home) as s:
        run = s.run(1, 1)
        assert run.orphans_left == []
        assert run.survivors == []
        assert (run.stop_requested_at, run.stop_grace, run.containment) == (None, None, None)
        assert s.processes(1, 1) == []
        assert s.latest_sample(1, 1) is None


def test_a_migrated_v1_database_takes_new_jobs(v1_home: Path) -> None:
    with Store(v1_home) as s:
        job_id, _ = s.create_job(spec("after-upgrade"), {}, NOW)
        s.update_run(job_id, 1, orphans_left=[{"pid": 9, "cmdline": "sleep 9"}])
        assert job_id == 2
        assert s.run(job_id).orphans_left == [{"pid": 9, "cmdline": "sleep 9"}]
        assert [j.name for j in s.jobs()] == ["train.py", "after-upgrade"]


# --- jobs -----------------------------------------------------------------------------------------


def test_create_job_records_the_job_its_first_run_and_an_event(store: Store) -> None:
    job_id, run = store.create_job(spec(), {"timeout_s": 60.0}, NOW)
    assert run == 1
    job = store.job(job_id)
    assert job.command == ("python", "train.py", "--lr", "3e-4")
    assert (job.cwd, job.name, job.created_at, job.options) == (
        "/home/ana/exp",
        "train.py",
        NOW,
        JobOptions(timeout_s=60.0),
    )
    assert store.run(job_id).state == JobState.STARTING
    assert [(e.kind, e.run, e.at) for e in store.events(job_id)] == [("created", 1, NOW)]


def test_create_job_in_another_state(store: Store) -> None:
    job_id, _ = store.create_job(spec(), {}, NOW, state=JobState.QUEUED)
    assert store.run(job_id).state == JobState.QUEUED


def test_job_by_id_and_by_name(store: Store) -> None:
    first, _ = store.create_job(spec("train"), {}, NOW)
    other, _ = store.create_job(spec("eval"), {}, NOW + 1)
    assert store.job(first).name == "train"
    assert store.job(str(other)).name == "eval"
    assert store.job("eval").id == other


def test_the_newest_job_of_a_name_wins(store: Store) -> None:
    store.create_job(spec("train"), {}, NOW)
    newest, _ = store.create_job(spec("train"), {}, NOW + 10)
    assert store.job("train").id == newest


def test_a_numeric_name_is_found_when_no_job_has_that_id(store: Store) -> None:
    job_id, _ = store.create_job(spec("2024"), {}, NOW)
    assert store.job("2024").id == job_id


def test_a_missing_job_is_job_not_found_with_a_remedy(store: Store) -> None:
    store.create_job(spec("train"), {}, NOW)
    for ref in ("nope", "99", 99, ""):
        with pytest.raises(JobNotFound) as info:
            store.job(ref)
        assert repr(str(ref)) in info.value.message
        assert "ps --all" in info.value.remedy


def test_a_superscript_digit_is_job_not_found(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.job("²")


def test_jobs_lists_in_creation_order(store: Store) -> None:
    for name in ("a", "b", "c"):
        store.create_job(spec(name), {}, NOW)
    assert [j.name for j in store.jobs()] == ["a", "b", "c"]


def test_the_job_environment_never_appears_in_repr(store: Store) -> None:
    secrets = {"HF_TOKEN": "hf_s3cr3t_t0ken", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG"}
    job_id, _ = store.create_job(spec(env=secrets), {}, NOW)
    job = store.job(job_id)
    assert job.env == secrets
    for text in (repr(job), str(job), repr(store.jobs()), repr(spec(env=secrets))):
        assert "hf_s3cr3t_t0ken" not in text
        assert "wJalrXUtnFEMI" not in text


# --- runs -----------------------------------------------------------------------------------------


def test_update_run_sets_fields(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    assert store.update_run(job_id, n, state=JobState.RUNNING, pid=4101, pid_start=77, started_at=NOW + 1)
    run = store.run(job_id, n)
    assert (run.state, run.pid, run.pid_start, run.started_at) == (JobState.RUNNING, 4101, 77, NOW + 1)


def test_update_run_stores_lists_as_json(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    orphans = [{"pid": 4711, "cmdline": "python worker"}]
    survivors = [{"pid": 4711, "cmdline": "python worker", "reason": "in D state"}]
    store.update_run(job_id, n, orphans_left=orphans, survivors=survivors)
    run = store.run(job_id)
    assert run.orphans_left == orphans
    assert run.survivors == [Survivor(4711, "python worker", "in D state")]


def test_update_run_only_if_state_is_a_compare_and_set(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    watched = (JobState.STARTING, JobState.RUNNING)
    assert store.update_run(job_id, n, only_if_state=watched, state=JobState.RUNNING) is True
    # The shim records the end...
    assert store.update_run(job_id, n, state=JobState.FAILED, exit_code=1, ended_at=NOW + 5) is True
    # ...and a CLI that saw the shim gone a moment earlier must not overwrite it with `lost`.
    assert store.update_run(job_id, n, only_if_state=watched, state=JobState.LOST) is False
    run = store.run(job_id)
    assert (run.state, run.exit_code) == (JobState.FAILED, 1)


def test_update_run_only_if_state_with_no_states_changes_nothing(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    assert store.update_run(job_id, n, only_if_state=[], state=JobState.LOST) is False
    assert store.run(job_id).state == JobState.STARTING


def test_update_run_with_event_writes_both_in_one_transaction(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    assert store.update_run_with_event(
        job_id, n, "started", NOW + 1, {"pid": 4101}, state=JobState.RUNNING, pid=4101, started_at=NOW + 1
    )
    run = store.run(job_id, n)
    assert (run.state, run.pid, run.started_at) == (JobState.RUNNING, 4101, NOW + 1)
    started = [e for e in store.events(job_id, n) if e.kind == "started"]
    assert [(e.at, e.data) for e in started] == [(NOW + 1, {"pid": 4101})]


def test_update_run_with_event_records_no_event_when_the_update_does_not_apply(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.update_run(job_id, n, state=JobState.SUCCEEDED)
    watched = (JobState.STARTING, JobState.RUNNING)
    assert not store.update_run_with_event(
        job_id, n, "supervisor-lost", NOW, {}, only_if_state=watched, state=JobState.LOST
    )
    assert store.run(job_id).state == JobState.SUCCEEDED
    assert [e.kind for e in store.events(job_id, n)] == ["created"]


def test_update_run_with_event_rejects_unknown_fields_before_writing(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    with pytest.raises(ValueError, match="unknown run fields"):
        store.update_run_with_event(job_id, n, "started", NOW, {}, colour="red")
    assert [e.kind for e in store.events(job_id, n)] == ["created"]


def test_update_run_of_a_missing_run_is_false(store: Store) -> None:
    job_id, _ = store.create_job(spec(), {}, NOW)
    assert store.update_run(job_id, 2, state=JobState.RUNNING) is False
    assert store.update_run(job_id + 1, 1, state=JobState.RUNNING) is False


def test_update_run_rejects_unknown_fields(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    with pytest.raises(ValueError, match="bogus"):
        store.update_run(job_id, n, bogus=1)
    injected: dict[str, Any] = {"state = 'lost', pid": 1}  # a column name is never trusted into the SQL
    with pytest.raises(ValueError):
        store.update_run(job_id, n, **injected)
    assert store.run(job_id).state == JobState.STARTING


def test_run_by_number_and_latest(store: Store) -> None:
    job_id, _ = store.create_job(spec(), {}, NOW)
    assert store.run(job_id).n == 1
    assert store.run(job_id, 1).n == 1
    with pytest.raises(JobNotFound):
        store.run(job_id, 2)
    with pytest.raises(JobNotFound):
        store.run(job_id + 1)


def test_latest_runs_maps_each_job_to_its_latest_run(store: Store) -> None:
    a, _ = store.create_job(spec("a"), {}, NOW)
    b, _ = store.create_job(spec("b"), {}, NOW)
    store.update_run(b, 1, state=JobState.SUCCEEDED)
    latest = store.latest_runs()
    assert {job: run.state for job, run in latest.items()} == {a: JobState.STARTING, b: JobState.SUCCEEDED}


# --- events ---------------------------------------------------------------------------------------


def test_events_in_order_with_their_data(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.add_event(job_id, n, "started", NOW + 1, pid=4101, containment="cgroup")
    store.add_event(job_id, None, "note", NOW + 2)
    store.add_event(job_id, n, "exited", NOW + 3, exit_code=0)
    events = store.events(job_id)
    assert [(e.kind, e.run) for e in events] == [
        ("created", 1),
        ("started", 1),
        ("note", None),
        ("exited", 1),
    ]
    assert events[1].data == {"pid": 4101, "containment": "cgroup"}
    assert events[2].data == {}


def test_events_of_one_run(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    other, _ = store.create_job(spec("other"), {}, NOW)
    store.add_event(job_id, None, "note", NOW)
    store.add_event(job_id, 2, "started", NOW)
    store.add_event(other, 1, "started", NOW)
    assert [e.kind for e in store.events(job_id, n)] == ["created"]
    assert [e.kind for e in store.events(job_id, 2)] == ["started"]


# --- processes and samples ------------------------------------------------------------------------


def test_record_tree_records_processes_and_a_sample(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.record_tree(
        job_id, n, NOW + 1, [snap(100, 10, rss=100), snap(101, 11, ppid=100, rss=50, cpu=None)], []
    )
    procs = store.processes(job_id, n)
    assert [(p.pid, p.start_time, p.ppid, p.cmdline, p.first_seen) for p in procs] == [
        (100, 10, 1, "python w100", NOW + 1),
        (101, 11, 100, "python w101", NOW + 1),
    ]
    sample = store.latest_sample(job_id, n)
    assert sample is not None
    assert (sample["at"], sample["nprocs"], sample["cpu_percent"], sample["rss_bytes"]) == (
        NOW + 1,
        2,
        50.0,
        150,
    )


def test_record_tree_updates_a_known_process_and_keeps_when_it_was_first_seen(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.record_tree(job_id, n, NOW + 1, [snap(100, 10, rss=100)], [])
    store.record_tree(job_id, n, NOW + 2, [snap(100, 10, rss=300, cpu=99.0)], [])
    (p,) = store.processes(job_id, n)
    assert (p.rss_bytes, p.cpu_percent, p.first_seen) == (300, 99.0, NOW + 1)
    sample = store.latest_sample(job_id, n)
    assert sample is not None and sample["at"] == NOW + 2 and sample["rss_bytes"] == 300


def test_a_reused_pid_is_another_process(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.record_tree(job_id, n, NOW + 1, [snap(100, 10)], [ProcessEnd(100, 10, 0, NOW + 1)])
    store.record_tree(job_id, n, NOW + 2, [snap(100, 99)], [])
    assert [(p.pid, p.start_time) for p in store.processes(job_id, n)] == [(100, 10), (100, 99)]


def test_record_tree_marks_ended_processes(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.record_tree(job_id, n, NOW + 1, [snap(100, 10), snap(101, 11)], [])
    store.record_tree(job_id, n, NOW + 2, [snap(100, 10)], [ProcessEnd(101, 11, 9, NOW + 2)])
    ended = {p.pid: p for p in store.processes(job_id, n)}[101]
    assert (ended.state, ended.ended_at, ended.wait_status) == ("X", NOW + 2, 9)
    assert [p.pid for p in store.processes(job_id, n, live_only=True)] == [100]
    # an end is recorded once: a later report does not move it
    store.record_tree(job_id, n, NOW + 3, [], [ProcessEnd(101, 11, 0, NOW + 3)])
    again = {p.pid: p for p in store.processes(job_id, n)}[101]
    assert (again.ended_at, again.wait_status) == (NOW + 2, 9)


def test_record_tree_records_a_process_never_seen_alive_with_its_moment_of_death(store: Store) -> None:
    # a worker killed 5 ms after birth: only the kernel's process events (or its reaping parent) told of it
    job_id, n = store.create_job(spec(), {}, NOW)
    end = ProcessEnd(202, 0, 9, NOW + 0.005, ppid=100, cmdline="python -c work", ranks=Ranks(1, 1, 0))
    store.record_tree(job_id, n, NOW + 1, [], [end])
    (p,) = store.processes(job_id, n)
    assert (p.pid, p.ppid, p.cmdline, p.state, p.ended_at, p.wait_status) == (
        202,
        100,
        "python -c work",
        "X",
        NOW + 0.005,
        9,
    )
    assert p.ranks == Ranks(1, 1, 0)
    assert store.processes(job_id, n, live_only=True) == []


def test_an_unknown_status_is_filled_in_by_a_later_report(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.record_tree(job_id, n, NOW + 1, [snap(100, 10)], [])
    store.record_tree(job_id, n, NOW + 2, [], [ProcessEnd(100, 10, None, NOW + 2)])
    store.record_tree(job_id, n, NOW + 3, [], [ProcessEnd(100, 10, 0x0B, NOW + 1.5)])
    (p,) = store.processes(job_id, n)
    assert (p.ended_at, p.wait_status) == (NOW + 2, 0x0B)


def test_live_processes_keep_their_ranks(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.record_tree(job_id, n, NOW + 1, [snap(100, 10)._replace(ranks=Ranks(3, 1, None))], [])
    assert store.processes(job_id, n)[0].ranks == Ranks(3, 1, None)


def test_record_tree_without_live_processes_adds_no_sample(store: Store) -> None:
    job_id, n = store.create_job(spec(), {}, NOW)
    store.record_tree(job_id, n, NOW + 1, [], [])
    assert store.latest_sample(job_id, n) is None


# --- delete ---------------------------------------------------------------------------------------


def test_delete_job_removes_everything_of_that_job_only(store: Store) -> None:
    gone, _ = store.create_job(spec("gone"), {}, NOW)
    kept, _ = store.create_job(spec("kept"), {}, NOW)
    for job_id in (gone, kept):
        store.add_event(job_id, 1, "started", NOW)
        store.record_tree(job_id, 1, NOW, [snap(100 + job_id, 1)], [])
    store.delete_job(gone)
    with pytest.raises(JobNotFound):
        store.job(gone)
    with pytest.raises(JobNotFound):
        store.run(gone)
    assert store.events(gone) == []
    assert store.processes(gone, 1) == []
    assert store.latest_sample(gone, 1) is None
    assert [j.id for j in store.jobs()] == [kept]
    assert len(store.events(kept)) == 2
    assert store.latest_sample(kept, 1) is not None


def test_delete_of_a_missing_job_is_harmless(store: Store) -> None:
    store.delete_job(12345)


# --- concurrency: many writers, one database, no "database is locked" ------------------------------


def test_threads_creating_jobs_at_once_all_succeed(home: Path) -> None:
    Store(home).close()
    workers, per_worker = 8, 25
    barrier = threading.Barrier(workers, timeout=30)
    errors: list[BaseException] = []
    ids: list[int] = []

    def work(tag: int) -> None:
        try:
            with Store(home) as s:
                barrier.wait()
                for i in range(per_worker):
                    job_id, _ = s.create_job(spec(f"t{tag}-{i}"), {}, NOW + i)
                    s.update_run(job_id, 1, only_if_state=[JobState.STARTING], state=JobState.RUNNING)
                    s.add_event(job_id, 1, "started", NOW + i)
                    ids.append(job_id)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(set(ids)) == workers * per_worker
    with Store(home) as s:
        assert len(s.jobs()) == workers * per_worker
        assert all(r.state == JobState.RUNNING for r in s.latest_runs().values())


_CHILD = """\
import sys
from pathlib import Path
from typing import Any
from jobwarden.model import JobSpec
from jobwarden.store import Store

home, count, tag = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
sys.stdin.readline()  # go: every child has started before any opens the store
with Store(home) as s:
    for i in range(count):
        s.create_job(JobSpec(("true",), "/", f"{tag}-{i}"), {}, float(i))
print("ok", flush=True)
"""


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"child {proc.pid} said nothing in {timeout_s}s"
    return proc.stdout.readline()


def _prepare_migrated(home: Path) -> None:
    Store(home).close()


def _prepare_wal_unmigrated(home: Path) -> None:
    # A database another jobwarden has just switched to WAL but not migrated yet: the children race
    # to migrate it, and all but one must find the work done once they hold the write lock.
    home.mkdir(parents=True, mode=0o700)
    conn = sqlite3.connect(home / "jobwarden.db")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()


@pytest.mark.parametrize(
    "prepare", [_prepare_migrated, _prepare_wal_unmigrated], ids=["migrated", "unmigrated"]
)
def test_processes_creating_jobs_at_once_all_succeed(home: Path, prepare: Callable[[Path], None]) -> None:
    prepare(home)
    children, per_child = 8, 50
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(home), str(per_child), f"p{c}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in range(children)
    ]
    try:
        for p in procs:
            assert _readline(p, timeout_s=60) == "ready\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [(p.returncode, err) for p, (_, err) in zip(procs, results, strict=True)] == [(0, "")] * children
    assert all(out.strip() == "ok" for out, _ in results)
    with Store(home) as s:
        names = [j.name for j in s.jobs()]
    assert len(names) == len(set(names)) == children * per_child
    assert schema_version(home / "jobwarden.db") == LATEST


def test_opening_a_new_database_waits_for_another_writer(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("jobwarden.store.db.BUSY_TIMEOUT_S", 0.5)
    home.mkdir(parents=True, mode=0o700)
    holder = sqlite3.connect(home / "jobwarden.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, on a file still in rollback-journal mode
    try:
        start = time.monotonic()
        with pytest.raises(StoreError, match="locked"):
            Store(home)
        waited = time.monotonic() - start
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert waited >= 0.25, f"gave up after {waited:.3f}s instead of waiting for the busy timeout"


# --- v3: restarts, findings, stack dumps, GPU claims ------------------------------------------------


def test_new_run_numbers_attempts_and_makes_their_directory(store: Store) -> None:
    job_id, _ = store.create_job(spec(), {}, NOW)
    assert store.new_run(job_id, JobState.RESTARTING, NOW + 1) == 2
    assert store.new_run(job_id, JobState.STARTING, NOW + 2) == 3
    assert store.run(job_id).n == 3
    assert store.run(job_id, 2).state == JobState.RESTARTING
    assert store.layout.run_dir(job_id, 3).is_dir()


def test_findings_round_trip_in_order(store: Store) -> None:
    job_id, run = store.create_job(spec(), {}, NOW)
    first = Finding("process-stopped", "Stopped", "pid 5 is stopped", "error", ("pid 5: T",), "SIGCONT", (5,))
    second = Finding("no-progress", "No progress", "quiet", "warning")
    store.add_finding(job_id, run, NOW + 2, second)
    store.add_finding(job_id, run, NOW + 1, first)
    assert store.findings(job_id, run) == [
        (NOW + 1, first._replace(at=NOW + 1)),
        (NOW + 2, second._replace(at=NOW + 2)),
    ]


def test_a_resolved_finding_keeps_its_moments_and_leaves_the_current_ones(store: Store) -> None:
    job_id, run = store.create_job(spec(), {}, NOW)
    stopped = Finding("process-stopped", "pid 5 stopped by SIGSTOP", "stopped", "warning", pids=(5,))
    idle = Finding("gpu-idle", "GPU 0 idle", "idle", "warning", pids=(5,))
    stopped_id = store.add_finding(job_id, run, NOW, stopped)
    store.add_finding(job_id, run, NOW + 1, idle)
    store.resolve_finding(job_id, run, stopped_id, NOW + 9)
    store.resolve_finding(job_id, run, stopped_id, NOW + 20)  # once: the first moment stays
    found = [f for _, f in store.findings(job_id, run)]
    assert [(f.rule, f.at, f.resolved_at) for f in found] == [
        ("process-stopped", NOW, NOW + 9),
        ("gpu-idle", NOW + 1, None),
    ]
    assert found[0].to_json()["resolved_at"] == "2023-11-14T22:13:29.000Z"
    assert found[1].to_json()["resolved_at"] is None
    assert store.current_findings([(job_id, run)]) == {(job_id, run): [("gpu-idle", "GPU 0 idle")]}
    assert store.current_findings([]) == {}


def test_stack_dumps_round_trip(store: Store) -> None:
    job_id, run = store.create_job(spec(), {}, NOW)
    frames = (Frame("wait", "/usr/lib/python3.11/threading.py", 320), Frame("__lll_lock_wait", native=True))
    stack = ProcessStack(7, "py-spy", (ThreadStack(7, "MainThread", frames, "S", False),), None, "python x")
    store.add_stacks(job_id, run, NOW, "hang", [stack, ProcessStack(8, "none", error="exited")])
    (dump,) = store.stacks(job_id, run)
    assert dump.trigger == "hang" and dump.at == NOW
    assert dump.stacks == (stack, ProcessStack(8, "none", error="exited"))


def test_gpu_claims_are_exclusive_between_live_runs(store: Store) -> None:
    a, _ = store.create_job(spec("a"), {}, NOW, state=JobState.QUEUED)
    b, _ = store.create_job(spec("b"), {}, NOW, state=JobState.QUEUED)
    assert store.claim_gpus(a, 1, [0, 1, 2], 2, NOW) == [0, 1]
    assert store.claim_gpus(b, 1, [0, 1, 2], 2, NOW) == []  # only GPU 2 is left: nothing is claimed
    assert store.gpu_claims() == {0: (a, 1), 1: (a, 1)}
    assert store.run(a).gpu_ids == (0, 1)
    assert store.claim_gpus(b, 1, [0, 1, 2], 1, NOW) == [2]


def test_claims_of_ended_runs_are_dropped_at_the_next_claim(store: Store) -> None:
    a, _ = store.create_job(spec("a"), {}, NOW, state=JobState.RUNNING)
    b, _ = store.create_job(spec("b"), {}, NOW, state=JobState.QUEUED)
    store.claim_gpus(a, 1, [0], 1, NOW)
    store.update_run(a, 1, state=JobState.FAILED)
    assert store.claim_gpus(b, 1, [0], 1, NOW) == [0]
    store.release_gpus(b, 1)
    assert store.gpu_claims() == {}


def _sqlite_error(path: Path, action: str) -> sqlite3.Error:
    """A real error from SQLite itself, for each kind translate() tells apart."""
    try:
        if action == "corrupt":
            path.write_bytes(b"this is no database at all, just text" * 200)
            sqlite3.connect(path).execute("SELECT * FROM sqlite_master").fetchall()
        elif action == "readonly":
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            conn.execute("CREATE TABLE t (x)")
        elif action == "cantopen":
            sqlite3.connect(f"file:{path / 'missing' / 'x.db'}?mode=rw", uri=True)
    except sqlite3.Error as err:
        return err
    raise AssertionError(f"SQLite raised nothing for {action}")


@pytest.mark.parametrize(
    ("action", "kind", "says"),
    [
        ("corrupt", StoreCorrupt, "is corrupt"),
        ("readonly", StoreError, "cannot open"),
        ("cantopen", StoreError, "cannot open"),
    ],
)
def test_sqlite_errors_are_told_apart_by_their_result_code(
    tmp_path: Path, action: str, kind: type[StoreError], says: str
) -> None:
    db = tmp_path / "x.db"
    if action == "readonly":
        sqlite3.connect(db).close()
    err = _sqlite_error(db, action)
    translated = translate(err, db)
    assert type(translated) is kind and says in translated.message


def test_job_options_are_stored_versioned_and_read_back_typed(store: Store) -> None:
    from jobwarden.control.options import run_options

    options = run_options(timeout="1h", grace="30s", gpu_ids="1,0", hang_timeout="off", notify="https://x/h")
    job_id, _ = store.create_job(spec(), options.to_json(), NOW)
    back = store.job(job_id).options
    assert back == options
    assert (back.timeout_s, back.grace_s, back.gpu_ids, back.hang_timeout_s) == (3600.0, 30.0, (1, 0), 0.0)
    assert options.to_json()["version"] == 1


def test_options_of_an_older_job_take_their_defaults_and_ignore_unknown_keys() -> None:
    old = JobOptions.from_json({"timeout_s": 5.0, "grace_s": 0, "a_flag_from_the_future": True})
    assert old == JobOptions(timeout_s=5.0) and old.grace_s == config.DEFAULT_GRACE_S

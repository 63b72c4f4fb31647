"""A database of every older schema version (tests/fixtures/jobwarden-v*.db, one per version before the
latest) opens with the current code: migrated to the latest version in place, and its job read back
through the code paths of `status`, `explain`, `metrics` and `ps` (control, then text's reports).

The fixtures are never regenerated newer: make_v1_db.py, make_v4_db.py and make_old_dbs.py say how each
was made. A new migration makes the latest version an old one: add its database here (the test that
counts them fails until then)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from jobwarden.control.changes import explained
from jobwarden.control.views.joblist import views_of
from jobwarden.control.views.jobstatus import status_of
from jobwarden.control.views.metrics import run_samples
from jobwarden.model import JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store
from jobwarden.store.schema import LATEST
from jobwarden.text import render

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OLD_VERSIONS = range(1, LATEST)
NOW = 1700003700.0
# what each fixture holds: its job's name and command, its run's end, the kinds of its events
WRITTEN = {
    1: ("train.py", ["python", "train.py", "--epochs", "3"], JobState.FAILED, 1),
    4: ("finetune.py", ["python", "finetune.py", "--steps", "500"], JobState.SUCCEEDED, 0),
    **{
        v: ("pretrain.py", ["python", "pretrain.py", "--lr", "3e-4"], JobState.FAILED, 1)
        for v in (2, 3, 5, 6, 7, 8, 9, 10)
    },
}


def user_version(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def test_every_older_schema_version_has_its_database() -> None:
    assert sorted(WRITTEN) == list(OLD_VERSIONS), "a new migration: check in a database of the version before"
    for version in OLD_VERSIONS:
        fixture = FIXTURES / f"jobwarden-v{version}.db"
        assert fixture.is_file(), fixture
        assert user_version(fixture) == version, (
            "an old fixture must stay at its version: never rebuild it newer"
        )
        assert not list(FIXTURES.glob(f"jobwarden-v{version}.db-*")), "one self-contained file, no -wal"


@pytest.fixture(params=list(OLD_VERSIONS), ids=lambda v: f"v{v}")
def old_home(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[int, Path]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shutil.copyfile(FIXTURES / f"jobwarden-v{request.param}.db", home / "jobwarden.db")
    return request.param, home


def test_an_old_database_is_migrated_to_the_latest_version(old_home: tuple[int, Path]) -> None:
    _, home = old_home
    Store(home).close()
    assert user_version(home / "jobwarden.db") == LATEST
    Store(home).close()  # and opens again, migrated: no migration runs twice
    assert user_version(home / "jobwarden.db") == LATEST


def test_an_old_job_reads_back_as_status_shows_it(old_home: tuple[int, Path]) -> None:
    version, home = old_home
    name, command, state, exit_code = WRITTEN[version]
    status = status_of(home, ProcFS(), "@last")
    assert (status.job.name, list(status.job.command), status.run.state) == (name, command, state)
    assert status.run.exit_code == exit_code
    assert [e.kind for e in status.events][:2] == ["created", "started"]
    assert status.to_json()["state"] == str(state)
    report = "\n".join(render.status_report(status, NOW))
    assert name in report and str(state) in report


def test_an_old_job_reads_back_as_explain_shows_it(old_home: tuple[int, Path]) -> None:
    version, home = old_home
    name, _, state, _ = WRITTEN[version]
    status = explained(home, ProcFS(), name)
    found = status.explain_json()
    assert found["state"] == str(state)
    report = list(render.explain_report(status, NOW))
    assert report, "explain says something of every ended run"
    rules = [f["rule"] for f in found["findings"]]
    if version in (1, 4):  # the hand-made ones: a plain failure, a success
        assert rules == (["exit-code"] if state == JobState.FAILED else []), rules
    elif version < 7:  # the hang it stored while it ran: before findings could be resolved, still current
        assert set(rules) == {"no-progress", "exit-code"}, rules
    else:  # resolved before the exit (migration 7): history, and the exit is the root cause
        assert rules[0] == "exit-code", rules
        assert "no-progress" not in [f.rule for f in status.current_findings]
        assert "no-progress" in [f.rule for f in status.resolved_findings]


def test_an_old_job_is_listed_and_its_samples_read(old_home: tuple[int, Path]) -> None:
    version, home = old_home
    name = WRITTEN[version][0]
    views = views_of(home, ProcFS(), include_ended=True)
    assert [v.job.name for v in views] == [name]
    assert list(render.ps_table(views, NOW))
    samples = run_samples(home, name, None, now=NOW)
    assert samples.malformed == 0
    if version >= 2:  # samples came with version 2
        assert samples.samples, "the samples an old shim wrote are read"
        assert all(s.rss_bytes for s in samples.samples)

"""The shim's cheap paths in JobTree: when a tick is worth a store write, and the marker check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobwarden.model import ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS, parse_stat
from jobwarden.shim.tree.jobtree import RECORD_AT_LEAST_EVERY_S, JobTree

MARKERS = {"JOBWARDEN_JOB_ID": "7", "JOBWARDEN_RUN": "1"}
NOW = 1_700_000_000.0


def snap(pid: int, cpu: float | None = 0.0) -> ProcessSnapshot:
    return ProcessSnapshot(pid, 1, 100, "S", "sleep 9", 1 << 20, cpu)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return tmp_path / "proc"


def tree(proc: Path) -> JobTree:
    proc.mkdir(exist_ok=True)
    return JobTree(ProcFS(proc), shim_pid=1, markers=MARKERS)


def test_the_first_tick_is_always_recorded(proc: Path) -> None:
    assert tree(proc).worth_recording([snap(10)], NOW)


def test_an_unchanged_tree_is_not_rewritten_until_the_record_is_old(proc: Path) -> None:
    t = tree(proc)
    snaps = [snap(10), snap(11)]
    t.recorded(snaps, NOW)
    assert not t.worth_recording(list(snaps), NOW + 1)
    assert not t.worth_recording(list(snaps), NOW + RECORD_AT_LEAST_EVERY_S - 0.1)
    assert t.worth_recording(list(snaps), NOW + RECORD_AT_LEAST_EVERY_S)


def test_any_change_is_recorded_at_once(proc: Path) -> None:
    t = tree(proc)
    t.recorded([snap(10), snap(11)], NOW)
    assert t.worth_recording([snap(10)], NOW + 1)  # a member ended
    assert t.worth_recording([snap(10), snap(11), snap(12)], NOW + 1)  # a new one
    assert t.worth_recording([snap(10), snap(11, cpu=3.0)], NOW + 1)  # one ran


def test_a_wall_clock_set_back_is_recorded(proc: Path) -> None:
    t = tree(proc)
    snaps = [snap(10)]
    t.recorded(snaps, NOW)
    assert t.worth_recording(snaps, NOW - 5)


def write_environ(proc: Path, pid: int, entries: list[str]) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "environ").write_bytes(b"".join(e.encode() + b"\0" for e in entries))


def test_markers_are_found_anywhere_in_the_environment(proc: Path) -> None:
    t = tree(proc)
    write_environ(proc, 20, ["JOBWARDEN_RUN=1", "PATH=/bin", "JOBWARDEN_JOB_ID=7"])
    assert t._has_markers(20)


@pytest.mark.parametrize(
    "entries",
    [
        ["JOBWARDEN_JOB_ID=77", "JOBWARDEN_RUN=1"],  # another job whose id starts the same
        ["XJOBWARDEN_JOB_ID=7", "JOBWARDEN_RUN=1"],  # a longer name ending the same
        ["JOBWARDEN_JOB_ID=7"],  # only some of the markers
        [],
    ],
)
def test_a_near_miss_is_not_a_marker(proc: Path, entries: list[str]) -> None:
    t = tree(proc)
    write_environ(proc, 21, entries)
    assert not t._has_markers(21)


def test_an_unreadable_environment_is_unmarked(proc: Path) -> None:
    assert not tree(proc)._has_markers(999)


def test_a_process_older_than_the_job_is_never_read_for_markers(proc: Path) -> None:
    t = tree(proc)
    t._job_born = 500
    older = parse_stat("30 (sh) S 1 30 30 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 499 0 0")
    newer = parse_stat("31 (sh) S 1 31 31 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0")
    assert not t._may_be_marked(older)
    assert t._may_be_marked(newer)
    t._unmarked[31] = 500  # looked at once already
    assert not t._may_be_marked(newer)


# --- a marked process of another uid -------------------------------------------------------------------

NOBODY = 65534


def fake_process(proc: Path, pid: int, ppid: int, uid: int, entries: list[str]) -> None:
    """/proc/PID with its stat, environment and owner (the directory's uid, as the kernel shows it)."""
    write_environ(proc, pid, entries)
    line = f"{pid} (sleep) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 600 0 0"
    (proc / str(pid) / "stat").write_text(line)
    os.chown(proc / str(pid), uid, -1)


MARKED = ["JOBWARDEN_JOB_ID=7", "JOBWARDEN_RUN=1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a fake /proc entry another owner needs root")
def test_a_marked_process_of_another_uid_is_a_member_only_if_it_descends_from_the_job(proc: Path) -> None:
    """Root reads every user's environment: a process of another user carrying a root job's markers was
    taken into the job (listed, counted against --mem-limit, its SIGSTOP a finding)."""
    t = tree(proc)  # its shim is pid 1 here
    fake_process(proc, 3, 0, 0, [])  # another user's login shell
    fake_process(proc, 40, 3, NOBODY, MARKED)  # planted by that user
    fake_process(proc, 41, 3, os.geteuid(), MARKED)  # the job's own uid: escaped, found by its markers
    fake_process(proc, 50, 1, os.geteuid(), [])  # a member, not itself marked (seeded)
    fake_process(proc, 51, 50, os.geteuid(), [])  # its child, a link on the way
    fake_process(proc, 52, 51, NOBODY, MARKED)  # the job changed user (setpriv): still the job's
    t.members[50] = None  # type: ignore[assignment]  # only its pid is looked at
    stats = {pid: ProcFS(proc).stat(pid) for pid in (40, 41, 52)}
    assert not t._marks_count(stats[40])
    assert t._marks_count(stats[41])
    assert t._marks_count(stats[52])


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a fake /proc entry another owner needs root")
def test_find_marked_keeps_another_uids_process_only_below_one_of_ours(proc: Path) -> None:
    from jobwarden.probes.markers import find_marked

    proc.mkdir()
    fake_process(proc, 40, 1, NOBODY, MARKED)
    fake_process(proc, 41, 1, os.geteuid(), MARKED)
    fake_process(proc, 42, 41, NOBODY, MARKED)
    found = find_marked(ProcFS(proc), {"JOBWARDEN_JOB_ID": "7", "JOBWARDEN_RUN": "1"})
    assert sorted(st.pid for st in found) == [41, 42]

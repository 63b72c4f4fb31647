"""shim.tree.pyfiles: the hooks' files of ended processes go, by identity; exceptions and fork records stay,
up to a cap (a /proc captured in a folder: which processes run)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.tree.pyfiles import MAX_KEPT, PyFiles
from tests.unit.test_procfs import add_process, stat_line


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    return root


def advert(py_dir: Path, pid: int, start: int) -> None:
    (py_dir / f"{pid}.json").write_text(json.dumps({"pid": pid, "start_time": start}))
    (py_dir / f"{pid}.stacks").write_bytes(b"")


def names(py_dir: Path) -> list[str]:
    return sorted(os.listdir(py_dir))


def test_an_ended_process_loses_its_advert_and_stacks_a_live_one_keeps_them(
    tmp_path: Path, proc: Path
) -> None:
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    add_process(proc, 10, stat_line(10, "python", f22=500))  # runs, started at 500
    add_process(proc, 11, stat_line(11, "python", f22=900))  # pid 11 reused: a new process
    advert(py_dir, 10, 500)
    advert(py_dir, 11, 700)  # the advert of the earlier process 11
    advert(py_dir, 12, 800)  # gone
    advert(py_dir, 13, 300)  # a member of the tree that /proc is not asked about
    (py_dir / "12.exc.json").write_text("{}")
    (py_dir / "14.stacks").write_bytes(b"")  # its advert was never written; pid 14 runs no more
    (py_dir / "events.fifo").write_bytes(b"")
    removed = PyFiles(py_dir, ProcFS(proc)).prune({13: 300})
    assert removed == 5
    assert names(py_dir) == ["10.json", "10.stacks", "12.exc.json", "13.json", "13.stacks", "events.fifo"]


def test_an_ended_ranks_flight_recorder_files_go_with_its_advert(tmp_path: Path, proc: Path) -> None:
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    add_process(proc, 10, stat_line(10, "python", f22=500))
    for pid, start in ((10, 500), (12, 800)):  # 10 runs, 12 ended
        advert(py_dir, pid, start)
        os.mkfifo(py_dir / f"{pid}.fr.req", 0o600)
        (py_dir / f"{pid}.fr.json").write_text("{}")
    assert PyFiles(py_dir, ProcFS(proc)).prune({}) == 4
    assert names(py_dir) == ["10.fr.json", "10.fr.req", "10.json", "10.stacks"]


def test_past_the_cap_later_exceptions_and_ended_fork_records_go(tmp_path: Path, proc: Path) -> None:
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    add_process(proc, 5, stat_line(5, "python", f22=1))  # a live parent
    add_process(proc, 7, stat_line(7, "python", f22=1))  # a live child of an ended parent
    for pid in range(100, 100 + MAX_KEPT + 50):
        (py_dir / f"{pid}.exc.json").write_text("{}")
        os.utime(py_dir / f"{pid}.exc.json", (pid, pid))  # written in pid order
        (py_dir / f"{pid}.forks.jsonl").write_text("")
        os.utime(py_dir / f"{pid}.forks.jsonl", (0, 0))  # the oldest: kept by the cap
    (py_dir / "5.forks.jsonl").write_text("")
    (py_dir / "6.forks.jsonl").write_text(
        json.dumps({"child_pid": 7, "parent_pid": 6, "fork_at": 1.0}) + "\n"  # older hooks' link line
    )
    add_process(proc, 9, stat_line(9, "python", f22=1))  # a live child that names its fork in its advert
    (py_dir / "8.forks.jsonl").write_text("")
    forked = {"parent_pid": 8, "fork_at": 1.0, "site": 1, "n": 5}
    (py_dir / "9.json").write_text(json.dumps({"pid": 9, "start_time": 1, "forked": forked}))
    PyFiles(py_dir, ProcFS(proc)).prune({})
    exceptions = sorted(int(n.split(".")[0]) for n in names(py_dir) if n.endswith(".exc.json"))
    assert exceptions == list(range(100, 100 + MAX_KEPT))  # the first ones: the story
    forks = {int(n.split(".")[0]) for n in names(py_dir) if n.endswith(".forks.jsonl")}
    # past the cap: a live parent's, and those of ended parents whose children run
    assert len(forks) == MAX_KEPT + 3 and {5, 6, 8} <= forks


def test_an_announced_advert_is_checked_before_it_is_written(tmp_path: Path, proc: Path) -> None:
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    files = PyFiles(py_dir, ProcFS(str(proc)))
    for bad in (
        b"{",
        b"[]",
        b'{"pid": true, "start_time": 1}',
        b'{"pid": 0, "start_time": 1}',
        b'{"pid": 5}',
        b"{" * 100_000,
    ):
        files.store_advert(bad)
    assert names(py_dir) == []
    (py_dir / "6.json.shim.tmp").symlink_to(tmp_path / "elsewhere")  # planted: never followed
    files.store_advert(b'{"pid": 6, "start_time": 1}')
    assert not (tmp_path / "elsewhere").exists() and not (py_dir / "6.json").exists()
    files.store_advert(b'{"pid": 7, "start_time": 1}')
    assert json.loads((py_dir / "7.json").read_text()) == {"pid": 7, "start_time": 1}
    files.store_advert(b'{"pid": 7, "start_time": 2}')  # a reused pid: the new process's
    assert json.loads((py_dir / "7.json").read_text()) == {"pid": 7, "start_time": 2}

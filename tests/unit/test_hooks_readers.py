"""Reading what the hooks left behind: adverts, fork records, the heartbeat (faulthandler's dumps are read in
test_stacks). The files are written by processes that may die mid-write: the partial and corrupt cases
matter as much as the good."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobwarden.model import ProcessId
from jobwarden.observations import ForkRecord, Frame, ThreadStack
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pyhooks import (
    Heartbeat,
    HookAdvert,
    read_adverts,
    read_forks,
    read_heartbeat,
    read_progress,
)
from tests.faultcheck import may_signal


def advert(pid: int = 100, **changes: object) -> dict[str, object]:
    return {
        "pid": pid,
        "start_time": 5000,
        "python": "3.8.18",
        "executable": "/usr/bin/python3",
        "fault_signal": 40,
        "fault_file": f"/run/py/{pid}.stacks",
        "ptracer": True,
        "mp_start": None,
        "exe": [2049, 77],
        "fault_fd": 4,
        "fault_file_id": [2049, 78],
        **changes,
    }


# --- adverts ----------------------------------------------------------------------------------------


def test_an_advert_is_read(tmp_path: Path) -> None:
    (tmp_path / "100.json").write_text(json.dumps(advert(mp_start="spawn")))
    assert read_adverts(tmp_path) == {
        100: HookAdvert(
            100,
            5000,
            "3.8.18",
            "/usr/bin/python3",
            40,
            Path("/run/py/100.stacks"),
            True,
            "spawn",
            (2049, 77),
            fault_fd=4,
            fault_file_id=(2049, 78),
        )
    }
    assert read_adverts(tmp_path)[100].process == ProcessId(100, 5000)


@pytest.mark.parametrize(
    "content",
    [
        "",
        '{"pid": 101, "start_time": 5',  # cut short
        "[1, 2]",
        "\x00\x00\x00",
        json.dumps({**advert(101), "pid": True}),  # a bool is not a pid
        json.dumps(advert(101, start_time="5000")),
        json.dumps(advert(101, ptracer=1)),
        json.dumps(advert(101, mp_start=3)),
        json.dumps(advert(101, exe=[1])),
        json.dumps(advert(101, exe=[1, True])),
        json.dumps(advert(101, exe="/usr/bin/python3")),
        json.dumps({k: v for k, v in advert(101).items() if k != "fault_signal"}),
        json.dumps(advert(999)),  # a file that names another process
    ],
)
def test_a_partial_or_corrupt_advert_is_skipped(tmp_path: Path, content: str) -> None:
    (tmp_path / "100.json").write_text(json.dumps(advert()))
    (tmp_path / "101.json").write_text(content)
    assert set(read_adverts(tmp_path)) == {100}


def test_temporary_and_foreign_files_are_not_adverts(tmp_path: Path) -> None:
    (tmp_path / "100.json.tmp").write_text(json.dumps(advert()))
    (tmp_path / "notes.json").write_text(json.dumps(advert()))
    (tmp_path / ".cache").mkdir()
    assert read_adverts(tmp_path) == {}
    assert read_adverts(tmp_path / "missing") == {}


def test_an_advert_without_a_handler_does_not_dump() -> None:
    assert not HookAdvert.from_json(advert(fault_signal=0, fault_file="")).dumps_on_signal
    assert HookAdvert.from_json(advert()).dumps_on_signal
    older_hooks = advert(fault_fd=None, fault_file_id=None)  # no descriptor to check: never signalled
    assert not HookAdvert.from_json(older_hooks).dumps_on_signal
    withdrawn = HookAdvert.from_json(
        advert(fault_signal=0, fault_withdrawn="the job set signal 40 to SIG_IGN")
    )
    assert withdrawn.withdrawn == "the job set signal 40 to SIG_IGN" and not withdrawn.dumps_on_signal


def fake_proc(
    root: Path, pid: int, start_time: int, sig_cgt: str, state: str = "S", runs: str = "python3"
) -> ProcFS:
    d = root / str(pid)
    d.mkdir(parents=True)
    fields = [state, "1", "1", "1", "0", "-1", "0", *["0"] * 12, str(start_time), "0", "0"]
    (d / "stat").write_text(f"{pid} (python3) {' '.join(fields)}\n")
    (d / "status").write_text(f"Name:\tpython3\nSigBlk:\t0000000000000000\nSigCgt:\t{sig_cgt}\n")
    (d / "exe").symlink_to(program_file(root, runs))
    (d / "fd").mkdir()
    stacks = root / f"{pid}.stacks"
    stacks.touch()
    (d / "fd" / "4").symlink_to(stacks)  # faulthandler's descriptor, still the hooks' file
    return ProcFS(root)


def stacks_advert(root: Path, pid: int = 100, **changes: object) -> dict[str, object]:
    """The advert of fake_proc's process: its stacks file at descriptor 4."""
    stacks = root / f"{pid}.stacks"
    return advert(pid, fault_file=str(stacks), fault_fd=4, fault_file_id=program_of(stacks), **changes)


def program_file(root: Path, name: str) -> Path:
    path = root / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.touch()
    return path


def program_of(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino]


@pytest.mark.parametrize(
    ("start_time", "sig_cgt", "state", "runs", "allowed"),
    [
        (5000, "0000008000000000", "S", "python3", True),  # bit 39: signal 40 caught
        (5000, "0000004000000000", "S", "python3", False),  # another signal caught
        (5000, "0000008000000000", "S", "raylet", False),  # exec()ed into a program that catches it too
        (5001, "0000008000000000", "S", "python3", False),  # the pid was reused
        (5000, "0000008000000000", "Z", "python3", False),
    ],
)
def test_may_signal_checks_identity_program_and_handler(
    tmp_path: Path, start_time: int, sig_cgt: str, state: str, runs: str, allowed: bool
) -> None:
    procfs = fake_proc(tmp_path, 100, start_time, sig_cgt, state, runs)
    python = program_of(program_file(tmp_path, "python3"))
    assert may_signal(HookAdvert.from_json(stacks_advert(tmp_path, exe=python)), procfs) is allowed


def test_may_signal_only_while_the_descriptor_is_the_stacks_file(tmp_path: Path) -> None:
    """The job closed faulthandler's descriptor and opened its own file under the number: a dump would
    be written into the job's data."""
    procfs = fake_proc(tmp_path, 100, 5000, "0000008000000000")
    python = program_of(program_file(tmp_path, "python3"))
    ours = HookAdvert.from_json(stacks_advert(tmp_path, exe=python))
    assert may_signal(ours, procfs) is True
    (tmp_path / "100" / "fd" / "4").unlink()
    (tmp_path / "data.csv").touch()
    (tmp_path / "100" / "fd" / "4").symlink_to(tmp_path / "data.csv")
    assert may_signal(ours, procfs) is False
    (tmp_path / "100" / "fd" / "4").unlink()  # closed
    assert may_signal(ours, procfs) is False


def test_may_signal_a_process_that_is_gone(tmp_path: Path) -> None:
    assert may_signal(HookAdvert.from_json(advert()), ProcFS(tmp_path)) is False


def test_an_advert_from_hooks_that_did_not_name_their_program_is_never_signalled(tmp_path: Path) -> None:
    procfs = fake_proc(tmp_path, 100, 5000, "0000008000000000")
    assert may_signal(HookAdvert.from_json(advert(exe=None)), procfs) is False


# --- fork records -----------------------------------------------------------------------------------


def fork_line(parent: int, at: float, **changes: object) -> str:
    record = {
        "at": at,
        "parent_pid": parent,
        "stack": [{"function": "Popen._launch", "file": "popen_fork.py", "line": 66}],
        "threads": [
            {
                "tid": 11,
                "name": "holder",
                "frames": [
                    {"function": "hold", "file": "job.py", "line": 5},
                    {"function": "run", "line": None},
                ],
            },
            {"tid": None, "name": None, "frames": []},
        ],
        "os_threads": 3,
        **changes,
    }
    return json.dumps(record)


def child_line(parent: int, at: float, child: int) -> str:
    return json.dumps({"child_pid": child, "parent_pid": parent, "fork_at": at})


def test_a_fork_record_is_joined_to_its_child(tmp_path: Path) -> None:
    (tmp_path / "100.forks.jsonl").write_text(
        "\n".join([fork_line(100, 1795302313.6905763), child_line(100, 1795302313.6905763, 102)]) + "\n"
    )
    assert read_forks(tmp_path) == [
        ForkRecord(
            parent_pid=100,
            at=1795302313.6905763,
            stack=(Frame("Popen._launch", "popen_fork.py", 66),),
            threads=(
                ThreadStack(11, "holder", (Frame("hold", "job.py", 5), Frame("run"))),
                ThreadStack(None, None, ()),
            ),
            child_pid=102,
        )
    ]


def test_a_child_that_never_reported_leaves_child_pid_none(tmp_path: Path) -> None:
    (tmp_path / "100.forks.jsonl").write_text(
        "\n".join([fork_line(100, 1.0), fork_line(100, 2.0), child_line(100, 2.0, 103)]) + "\n"
    )
    assert [(r.at, r.child_pid) for r in read_forks(tmp_path)] == [(1.0, None), (2.0, 103)]


def test_a_child_forked_after_its_sites_full_records_gets_the_sites_record(tmp_path: Path) -> None:
    """The hooks record the first 2 forks of a site, then counts at powers of two; each child names its
    fork in its own advert (pid 300 and 301: forks 4 and 5 of site 1; pid 302: fork 1 of site 2)."""
    (tmp_path / "100.forks.jsonl").write_text(
        "\n".join(
            [
                fork_line(100, 1.0, site=1, n=1),
                fork_line(100, 2.0, site=1, n=2),
                json.dumps({"parent_pid": 100, "site": 1, "forks": 4, "at": 4.0}),
                fork_line(100, 6.0, site=2, n=1),
            ]
        )
        + "\n"
    )
    links = {300: (4.0, 1, 4), 301: (5.0, 1, 5), 302: (6.0, 2, 1), 303: (7.0, 9, 1)}  # 9: no record
    for child, (at, site, n) in links.items():
        forked = {"parent_pid": 100, "fork_at": at, "site": site, "n": n}
        (tmp_path / f"{child}.json").write_text(json.dumps(advert(child, forked=forked)))
    found = [(r.at, r.child_pid, r.site_forks, r.exact) for r in read_forks(tmp_path)]
    assert found == [
        (1.0, None, 5, True),
        (2.0, None, 5, True),
        (4.0, 300, 5, False),
        (5.0, 301, 5, False),
        (6.0, 302, 1, True),
    ]
    (later,) = [r for r in read_forks(tmp_path) if r.child_pid == 301]
    assert later.threads[0].name == "holder" and later.stack[0].function == "Popen._launch"


def test_partial_and_corrupt_lines_are_skipped(tmp_path: Path) -> None:
    lines = [
        fork_line(100, 1.0),
        "not json",
        "[1, 2]",
        fork_line(100, 2.0, stack="oops"),
        fork_line(100, 3.0, parent_pid="100"),
        json.dumps({"child_pid": "x", "parent_pid": 100, "fork_at": 1.0}),
        fork_line(100, 4.0)[:40],  # the writer died mid-line
    ]
    (tmp_path / "100.forks.jsonl").write_text("\n".join(lines))
    assert [(r.at, r.child_pid) for r in read_forks(tmp_path)] == [(1.0, None)]


def test_records_of_several_processes_come_oldest_first(tmp_path: Path) -> None:
    (tmp_path / "100.forks.jsonl").write_text(fork_line(100, 5.0) + "\n" + child_line(101, 2.0, 104) + "\n")
    (tmp_path / "101.forks.jsonl").write_text(fork_line(101, 2.0) + "\n")
    assert [(r.parent_pid, r.at, r.child_pid) for r in read_forks(tmp_path)] == [
        (101, 2.0, 104),
        (100, 5.0, None),
    ]
    assert read_forks(tmp_path / "missing") == []


# --- heartbeat --------------------------------------------------------------------------------------


def set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when))


def test_no_heartbeat_file_is_none(tmp_path: Path) -> None:
    assert read_heartbeat(tmp_path / "heartbeat") is None


@pytest.mark.parametrize("content", ["", "touched by a shell script\n", "[1]", "{broken"])
def test_a_touched_file_counts_by_its_mtime(tmp_path: Path, content: str) -> None:
    path = tmp_path / "heartbeat"
    path.write_text(content)
    set_mtime(path, 1000.0)
    assert read_heartbeat(path) == Heartbeat(1000.0, {})


def test_the_json_heartbeat_gives_its_info_and_the_later_time(tmp_path: Path) -> None:
    path = tmp_path / "heartbeat"
    path.write_text(json.dumps({"at": 2000.5, "info": {"step": 3}}))
    set_mtime(path, 1000.0)  # a copied file: mtime older than its content
    assert read_heartbeat(path) == Heartbeat(2000.5, {"step": 3})
    set_mtime(path, 3000.0)  # touched since it was written
    assert read_heartbeat(path) == Heartbeat(3000.0, {"step": 3})


@pytest.mark.parametrize("payload", [{"at": "soon", "info": [1]}, {"at": True}, {}])
def test_odd_json_heartbeats_fall_back_to_the_mtime(tmp_path: Path, payload: dict[str, object]) -> None:
    path = tmp_path / "heartbeat"
    path.write_text(json.dumps(payload))
    set_mtime(path, 1000.0)
    assert read_heartbeat(path) == Heartbeat(1000.0, {})


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_what_the_job_plants_in_place_of_its_records_is_not_read(tmp_path: Path, planted: str) -> None:
    """The job writes its heartbeat and its bars' records: a FIFO there would block the supervisor in
    open() for good, a symlink lead it to another file. Neither is read; the call returns at once."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(json.dumps({"at": 1.0, "info": {"step": 3}, "pid": 42, "bars": []}))
    for path in (tmp_path / "heartbeat", tmp_path / "42.progress"):
        if planted == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(elsewhere)
    assert read_heartbeat(tmp_path / "heartbeat") is None
    assert read_progress(tmp_path, 42) is None

"""Which of the user's other jobs a process outside the hung job belongs to (shim.tree.whosejob): the store's
records of a live run, or the job's marker with descent from a recorded process; a copied marker alone,
or another home's, names nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.model import JobSpec, JobState, ProcessSnapshot
from jobwarden.observations import WaitParty
from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.tree.whosejob import with_jobs
from jobwarden.store import Store

NOW = 1_800_000_000.0


def stat_line(pid: int, ppid: int, start: int) -> str:
    fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "4194304"] + ["0"] * 12 + [str(start)]
    return f"{pid} (python) {' '.join(fields + ['0'] * 30)}\n"


class Tree:
    """A /proc of a few processes under a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        (root / "stat").write_text("cpu  1 0 1 1 0 0 0 0 0 0\nbtime 1700000000\n")

    def add(self, pid: int, ppid: int, env: dict[str, str] | None = None) -> int:
        d = self.root / str(pid)
        d.mkdir()
        (d / "stat").write_text(stat_line(pid, ppid, pid * 100))
        (d / "cmdline").write_bytes(b"python\0x.py\0")
        (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))
        return pid * 100


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as opened:
        yield opened


def outside(*pids: int) -> dict[int, WaitParty]:
    return {pid: WaitParty(pid, "python x.py", "me", in_job=False) for pid in pids}


def test_a_recorded_process_or_a_marked_descendant_of_one_is_named_with_its_job(
    store: Store, tmp_path: Path
) -> None:
    job, run = store.create_job(
        JobSpec(("python", "prep.py"), "/srv", "prep-data"), {}, NOW, JobState.RUNNING
    )
    this, _ = store.create_job(JobSpec(("python", "train.py"), "/srv", "train"), {}, NOW, JobState.RUNNING)
    tree = Tree(tmp_path / "proc")
    marks = {"JOBWARDEN_HOME": str(store.layout.home), "JOBWARDEN_JOB_ID": str(job)}
    start = tree.add(4242, 1, marks)
    store.record_tree(job, run, NOW, [ProcessSnapshot(4242, 1, start, "S", "python prep.py", 1, None)], [])
    tree.add(5000, 4242, marks)  # started by the recorded process, not recorded (yet)
    tree.add(6000, 1, marks)  # a copied marker: started by nobody of the job
    tree.add(7000, 4242, {**marks, "JOBWARDEN_HOME": "/elsewhere"})  # another home's job of that number
    found = with_jobs(outside(4242, 5000, 6000, 7000), store, ProcFS(tree.root), this)
    assert {pid: (p.job, p.job_name) for pid, p in found.items()} == {
        4242: (job, "prep-data"),
        5000: (job, "prep-data"),
        6000: (None, ""),
        7000: (None, ""),
    }
    assert with_jobs(outside(4242), store, ProcFS(tree.root), job)[4242].job is None  # the hung job itself

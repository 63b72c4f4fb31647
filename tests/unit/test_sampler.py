"""The shim's sampler: each tick's reading of the whole run (CPU seconds and storage bytes as run totals,
GPU use from the fake NVML), and what it stores as the run goes on and ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.clock import FakeClock
from jobwarden.model import JobSpec, ProcessId, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import fakenvml
from jobwarden.probes.gpu import open_gpu_probe
from jobwarden.shim.record.recorder import RunRecorder
from jobwarden.shim.tree.jobtree import Member
from jobwarden.shim.watch.gpuwatch import GpuWatch
from jobwarden.shim.watch.sampler import Sampler
from jobwarden.store import Store
from jobwarden.store.logfiles import LogWatcher
from jobwarden.store.rollup import GpuReading

GIB = 1 << 30
T0 = 1_700_000_400.0


class FakeProc:
    """A /proc tree with io files, and members as the tree's sampling leaves them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procfs = ProcFS(root)
        self.members: dict[int, Member] = {}

    def process(self, pid: int, ticks: int, read: int, write: int) -> Member:
        """A member that ran since the last look: a new stat line, its ticks, its io file."""
        (self.root / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.root / str(pid) / "io").write_bytes(
            f"rchar: 0\nwchar: 0\nsyscr: 0\nsyscw: 0\nread_bytes: {read}\nwrite_bytes: {write}\n"
            "cancelled_write_bytes: 0\n".encode()
        )
        member = self.members.get(pid) or Member(ProcessId(pid, 5000 + pid), -1, 1, f"python w{pid}")
        member.last_ticks, member.raw_stat = ticks, f"{pid} (python) R {ticks}".encode()
        self.members[pid] = member
        return member

    def snaps(self) -> list[ProcessSnapshot]:
        return [
            ProcessSnapshot(m.pid, 1, m.ident.start_time, "R", m.cmdline, 100 << 20, 50.0)
            for m in self.members.values()
        ]


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as s:
        yield s


def sampler_for(store: Store, proc: FakeProc) -> tuple[Sampler, int, int]:
    job_id, run = store.create_job(JobSpec(("python",), "/tmp", "train.py", {}), {}, T0)
    layout = store.layout
    logs = LogWatcher(layout.output_log(job_id, run), layout.output_index(job_id, run))
    return Sampler(proc.procfs, RunRecorder(store, job_id, run, logs, FakeClock())), job_id, run


def test_counters_are_run_totals_that_never_go_back(store: Store, proc: FakeProc) -> None:
    sampler, _, _ = sampler_for(store, proc)
    hz = proc.procfs.ticks_per_s
    proc.process(4001, ticks=2 * hz, read=1000, write=5000)
    proc.process(4002, ticks=1 * hz, read=10, write=20)
    first = sampler.reading(T0, proc.snaps(), proc.members.values(), None)
    assert (first.cpu_time_s, first.io_read_bytes, first.io_write_bytes) == (3.0, 1010, 5020)
    assert (first.nprocs, first.cpu_percent, first.rss_bytes) == (2, 100.0, 200 << 20)
    del proc.members[4002]  # a worker ended: its seconds and bytes stay the run's
    proc.process(4001, ticks=4 * hz, read=3000, write=9000)
    second = sampler.reading(T0 + 1, proc.snaps(), proc.members.values(), None)
    assert (second.cpu_time_s, second.io_read_bytes, second.io_write_bytes) == (5.0, 3010, 9020)


def test_a_process_not_scheduled_since_the_last_look_is_not_read_again(store: Store, proc: FakeProc) -> None:
    sampler, _, _ = sampler_for(store, proc)
    proc.process(4001, ticks=100, read=1000, write=5000)
    sampler.reading(T0, proc.snaps(), proc.members.values(), None)
    (proc.root / "4001" / "io").unlink()  # a read now would fail: the same stat line means no new I/O
    again = sampler.reading(T0 + 1, proc.snaps(), proc.members.values(), None)
    assert (again.io_read_bytes, again.io_write_bytes) == (1000, 5000)


def test_io_of_processes_the_kernel_hides_is_unknown_not_zero(
    store: Store, proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampler, _, _ = sampler_for(store, proc)
    proc.process(4001, ticks=100, read=1000, write=5000)
    monkeypatch.setattr(proc.procfs, "io", lambda pid: None)  # EACCES: another user's (test_procio.py)
    reading = sampler.reading(T0, proc.snaps(), proc.members.values(), None)
    assert reading.cpu_time_s == 100 / proc.procfs.ticks_per_s
    assert (reading.io_read_bytes, reading.io_write_bytes) == (None, None)


def test_gpu_use_per_gpu_and_in_total_from_the_fake_nvml(
    store: Store, proc: FakeProc, tmp_path: Path
) -> None:
    state = tmp_path / "nvml.json"
    fakenvml.write_state(state, {"devices": [fakenvml.device(i, utilization=60 + 20 * i) for i in range(3)]})
    fakenvml.hold(state, 0, 4001, 2 * GIB)
    fakenvml.hold(state, 1, 4002, 3 * GIB)
    fakenvml.hold(state, 2, 9999, 7 * GIB)  # another job's: neither its memory nor its GPU count
    probe = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert probe is not None
    watch = GpuWatch(probe)
    try:
        sampler, _, _ = sampler_for(store, proc)
        proc.process(4001, ticks=100, read=0, write=0)
        proc.process(4002, ticks=100, read=0, write=0)
        watch.sample(0.0, proc.members)
        reading = sampler.reading(T0, proc.snaps(), proc.members.values(), watch)
        assert reading.gpus == (GpuReading(0, 60.0, 2 * GIB), GpuReading(1, 80.0, 3 * GIB))
        assert (reading.gpu_util, reading.gpu_memory_bytes) == (70.0, 5 * GIB)
        fakenvml.release(state, 4002)
        watch.sample(10.0, proc.members)
        later = sampler.reading(T0 + 10, proc.snaps(), proc.members.values(), watch)
        assert later.gpus == (GpuReading(0, 60.0, 2 * GIB),) and later.gpu_memory_bytes == 2 * GIB
    finally:
        watch.close()
    no_gpu = sampler.reading(T0 + 11, proc.snaps(), proc.members.values(), None)
    assert (no_gpu.gpu_util, no_gpu.gpu_memory_bytes, no_gpu.gpus) == (None, None, ())


def test_the_sampler_stores_points_as_they_close_and_all_of_them_at_the_end(
    store: Store, proc: FakeProc
) -> None:
    sampler, job_id, run = sampler_for(store, proc)
    for second in range(95):
        proc.process(4001, ticks=second * 10, read=second, write=2 * second)
        now = T0 + second
        reading = sampler.reading(now, proc.snaps(), proc.members.values(), None)
        if second % 10 == 0:  # an idle tree is written only now and then; its readings still count
            assert sampler.write(now, proc.snaps(), reading)
        sampler.keep_up(now)
    assert [b.at for b in store.rollups(job_id, run, 10)] == [T0 + 10 * i for i in range(9)]
    assert store.rollups(job_id, run, 60)[0].n == 60 and store.rollups(job_id, run, 600) == []
    assert len(store.readings(job_id, run)) == 10
    sampler.finish(T0 + 95)
    assert [b.n for b in store.rollups(job_id, run, 600)] == [95]
    assert [b.n for b in store.rollups(job_id, run, 10)][-1] == 5

"""The data-loading speed rules (rules.speed.loading) on main-thread stacks recorded with `py-spy dump
--nonblocking` from tests/integration/jobs/loader_job.py (torch 2.13, Python 3.11): each fires on its
cause with its share, and stays silent where it must: a DataLoader that keeps up, workers that idle while
the loop waits, no idle CPU to give a worker, too few samples."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.model import ProcessId, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.rules.speed import judge
from jobwarden.rules.speed.evidence import Segment, SpeedEvidence, StackSample
from jobwarden.rules.speed.loading import loads_in_main, waits_on_workers, worth_sampling
from jobwarden.shim.tree.jobtree import Member
from jobwarden.shim.watch.stacksample import (
    BURST_DUMPS,
    BURST_S,
    STACK_EVERY_S,
    StackSampler,
    loop_candidates,
)

from .test_speed_rules import HEALTHY, one, rules

SITE = "/venv/lib/python3.11/site-packages/"
PYLIB = "/usr/lib/python3.11/"
JOB = "/work/train.py"

# num_workers=0, a CPU-heavy __getitem__: the main thread fetches its own batch
IN_MAIN = (
    ("Burning.__getitem__", JOB),
    ("_MapDatasetFetcher.fetch.<locals>.<listcomp>", SITE + "torch/utils/data/_utils/fetch.py"),
    ("_MapDatasetFetcher.fetch", SITE + "torch/utils/data/_utils/fetch.py"),
    ("_SingleProcessDataLoaderIter._next_data", SITE + "torch/utils/data/dataloader.py"),
    ("_BaseDataLoaderIter.__next__", SITE + "torch/utils/data/dataloader.py"),
    ("main", JOB),
    ("<module>", JOB),
)
# one busy worker, a trivial model: the main thread waits on the workers' result queue
WAITING = (
    ("_PollLikeSelector.select", PYLIB + "selectors.py"),
    ("wait", PYLIB + "multiprocessing/connection.py"),
    ("Connection._poll", PYLIB + "multiprocessing/connection.py"),
    ("_ConnectionBase.poll", PYLIB + "multiprocessing/connection.py"),
    ("Queue.get", PYLIB + "multiprocessing/queues.py"),
    ("_MultiProcessingDataLoaderIter._try_get_data", SITE + "torch/utils/data/dataloader.py"),
    ("_MultiProcessingDataLoaderIter._get_data", SITE + "torch/utils/data/dataloader.py"),
    ("_MultiProcessingDataLoaderIter._next_data", SITE + "torch/utils/data/dataloader.py"),
    ("_BaseDataLoaderIter.__next__", SITE + "torch/utils/data/dataloader.py"),
    ("main", JOB),
    ("<module>", JOB),
)
# the model step (torch ops in C: only the job's own frames)
COMPUTING = (("main", JOB), ("<module>", JOB))
# a user's own fetch() in their own file is no DataLoader
OWN_FETCH = (("fetch", JOB), ("main", JOB))


def samples(*stacks: tuple[tuple[str, str], ...]) -> tuple[StackSample, ...]:
    return tuple(StackSample(float(10 * i), s) for i, s in enumerate(stacks))


def loading(
    stacks: tuple[StackSample, ...], workers: int = 0, worker_cpu: float = 0.0, **kw: float
) -> SpeedEvidence:
    span = stacks[-1].at - stacks[0].at if stacks else 0.0
    return replace(
        HEALTHY,
        stack_samples=stacks,
        stack_span_s=span,
        loader_workers=workers,
        loader_worker_cpu=worker_cpu,
        **kw,  # type: ignore[arg-type]
    )


def test_the_classifiers_on_recorded_stacks() -> None:
    assert waits_on_workers(StackSample(0, WAITING)) and not loads_in_main(StackSample(0, WAITING))
    assert loads_in_main(StackSample(0, IN_MAIN)) and not waits_on_workers(StackSample(0, IN_MAIN))
    for other in (COMPUTING, OWN_FETCH, ()):
        assert not waits_on_workers(StackSample(0, other)) and not loads_in_main(StackSample(0, other))


def test_a_loop_waiting_on_busy_workers_is_input_bound() -> None:
    ev = loading(samples(*[WAITING] * 6, *[COMPUTING] * 2), workers=1, worker_cpu=0.95, cpu_s=20.0)
    f = one(ev, "input-bound")
    assert f.title == "the loop waits on its DataLoader 75% of the time"
    assert f.severity == "warning"
    assert "6 of 8 py-spy dumps over the last 70s" in f.evidence[0]
    assert "1 pt_data_worker process used 0.95 CPUs" in f.evidence[1]
    assert "num_workers=2" in f.remedy and "pin_memory" in f.remedy and "prefetch_factor" in f.remedy
    # no CPU of its allowance left: more workers would only take turns with the loop
    full = one(replace(ev, cpu_s=39.0), "input-bound")
    assert "num_workers" not in full.remedy and full.remedy.startswith("Give the job more CPUs")
    assert "data-loading-in-main" not in rules(judge(ev))


def test_input_bound_needs_busy_workers_a_majority_and_enough_samples() -> None:
    waiting = samples(*[WAITING] * 6, *[COMPUTING] * 2)
    assert "input-bound" in rules(judge(loading(waiting, workers=2, worker_cpu=1.6)))
    # the workers idle while the loop waits: not a lack of workers (a slow hand-over, a lock)
    assert "input-bound" not in rules(judge(loading(waiting, workers=2, worker_cpu=0.3)))
    # a DataLoader that keeps up: the loop computes most of the time
    keeps_up = samples(*[WAITING] * 2, *[COMPUTING] * 6)
    assert "input-bound" not in rules(judge(loading(keeps_up, workers=1, worker_cpu=0.95)))
    assert "input-bound" not in rules(judge(loading(samples(*[WAITING] * 4), workers=1, worker_cpu=0.95)))
    assert "input-bound" not in rules(judge(loading(samples(*[WAITING] * 8), workers=0)))
    assert not rules(judge(HEALTHY))  # no samples (no py-spy, no torch): nothing said


def test_loading_in_the_main_process_with_idle_cpus() -> None:
    ev = loading(samples(*[IN_MAIN] * 5, *[COMPUTING] * 2), cpu_s=20.0)  # 1 of 2 CPUs used
    f = one(ev, "data-loading-in-main")
    assert f.title == "data loading runs in the main process 71% of the time (num_workers=0)"
    assert f.severity == "warning"
    assert "5 of 7 py-spy dumps" in f.evidence[0]
    assert "most often in Burning.__getitem__ (/work/train.py)" in f.evidence[0]
    assert "num_workers=1" in f.remedy
    assert "input-bound" not in rules(judge(ev))


def test_loading_in_main_needs_idle_cpus_no_workers_and_a_majority() -> None:
    in_main = samples(*[IN_MAIN] * 5, *[COMPUTING] * 2)
    assert "data-loading-in-main" in rules(judge(loading(in_main, cpu_s=20.0)))
    # its CPUs are full (a quota of one, or the job's other processes): workers would only take turns
    assert "data-loading-in-main" not in rules(judge(loading(in_main, cpu_s=19.0, cpus=1.0)))
    assert "data-loading-in-main" not in rules(judge(loading(in_main, cpu_s=38.0)))
    # workers exist: the main process's own fetching is another loader's (validation), not num_workers=0
    assert "data-loading-in-main" not in rules(judge(loading(in_main, workers=1, worker_cpu=0.9, cpu_s=20.0)))
    mostly_model = samples(*[IN_MAIN] * 2, *[COMPUTING] * 6)
    assert "data-loading-in-main" not in rules(judge(loading(mostly_model, cpu_s=20.0)))
    assert "data-loading-in-main" not in rules(judge(loading(samples(*[IN_MAIN] * 4), cpu_s=20.0)))


frame = st.tuples(st.text(max_size=40), st.text(max_size=80))


@given(
    st.lists(st.lists(frame, max_size=12), max_size=14), st.integers(0, 4), st.floats(0, 8), st.floats(0, 40)
)
def test_the_rules_take_any_stacks(
    stacks: list[list[tuple[str, str]]], workers: int, cpu: float, cpu_s: float
) -> None:
    # the frames are py-spy's reading of the job's memory: outside input; never a crash, a share in [0, 1]
    ev = loading(samples(*(tuple(s) for s in stacks)), workers=workers, worker_cpu=cpu, cpu_s=cpu_s)
    for f in judge(ev):
        if f.rule in ("input-bound", "data-loading-in-main"):
            share = int(f.title.split("%")[0].rsplit(" ", 1)[1])
            assert 50 <= share <= 100


# --- the shim's sampler (shim.watch.stacksample): which process, when it dumps, what it keeps ---------

PID = 4242  # the training loop (torch loaded)
DASH = 4240  # a wrapper shell above it: `jobwarden run -- sh -c "python train.py; ..."`
TORCH_MAPS = "7f00 r-xp /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so\n"
NUMPY_MAPS = "7f00 r-xp /venv/lib/python3.11/site-packages/numpy/core/_multiarray.so\n"


def snap(cpu: float, pid: int = PID) -> ProcessSnapshot:
    return ProcessSnapshot(pid, 1, 1, "R", "python train.py", 1 << 20, cpu)


def member(pid: int, ppid: int, cmdline: str, comm: str = "python") -> Member:
    return Member(ProcessId(pid, 500 + pid), -1, ppid, cmdline, comm)


LOOP = [member(PID, 1, "python train.py")]


def fake_proc(tmp_path: Path, maps: str, pid: int = PID, exe: str = "/usr/bin/python3.11") -> ProcFS:
    """/proc/PID/maps and /proc/PID/exe of one process (the OS seam the sampler reads)."""
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "maps").write_text(maps)
    if (d / "exe").is_symlink():
        (d / "exe").unlink()
    (d / "exe").symlink_to(exe)
    return ProcFS(tmp_path / "proc")


def fake_py_spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for py-spy that answers a dump of any pid: its main thread (tid = the pid) waiting on its
    workers, and a pin-memory thread; it records each call."""
    threads = [
        {
            "os_thread_id": 1,
            "thread_name": "pt_data_pin",
            "frames": [{"name": "_pin_memory_loop", "filename": "x.py", "line": 1}],
        },
        {
            "os_thread_id": "TID",
            "thread_name": "MainThread",
            "frames": [{"name": n, "filename": f, "line": 10 + i} for i, (n, f) in enumerate(WAITING)],
        },
    ]
    script = tmp_path / "py-spy"
    answer = json.dumps(threads).replace('"TID"', "$3")  # py-spy dump --pid PID --json --nonblocking
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\ncat <<EOF\n{answer}\nEOF\n')
    script.chmod(0o755)
    monkeypatch.setenv("JOBWARDEN_PY_SPY", str(script))
    return tmp_path / "calls"


def settle(sampler: StackSampler, mono: float, members: list[Member] = LOOP) -> None:
    """Wait (with a deadline) for the dump in flight, then let a tick collect it."""
    pending = sampler._pending
    if pending is not None:
        pending.join(timeout=30)
        assert not pending.is_alive()
    sampler.tick(mono, members, [snap(0.0)])


def dumped(calls: Path) -> list[int]:
    """The pids py-spy was asked to dump, in order."""
    if not calls.exists():
        return []
    return [int(line.split()[2]) for line in calls.read_text().splitlines()]


def test_the_sampler_dumps_the_main_thread_only_when_busy_with_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_py_spy(tmp_path, monkeypatch)
    procfs = fake_proc(tmp_path, NUMPY_MAPS)
    sampler = StackSampler(procfs, every_s=10.0)
    sampler.tick(0.0, LOOP, [snap(95.0)])  # busy, no torch: no dump
    assert sampler._pending is None
    fake_proc(tmp_path, TORCH_MAPS)
    sampler.tick(5.0, LOOP, [snap(95.0)])  # within the interval
    assert sampler._pending is None
    sampler.tick(10.0, LOOP, [snap(20.0)])  # torch, idle: no dump
    assert sampler._pending is None
    sampler.tick(20.0, LOOP, [snap(95.0)])
    settle(sampler, 21.0)
    assert [s.frames for s in sampler.samples] == [WAITING] and sampler.samples[0].at == 20.0
    assert sampler.samples[0].lines[:2] == (10, 11) and sampler.samples[0].stall_at is None
    assert calls.read_text().split() == ["dump", "--pid", str(PID), "--json", "--nonblocking"]
    sampler.tick(30.0, LOOP, [snap(95.0)])
    settle(sampler, 31.0)
    assert len(sampler.samples) == 2 and sampler.span_s() == 10.0 and sampler.pid == PID
    sampler.tick(32.0, [member(PID + 7, 1, "python train.py")], [snap(95.0)])  # the loop exited
    assert not sampler.samples and sampler.pid is None  # its samples are not the next one's


def test_the_sampler_without_py_spy_takes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBWARDEN_PY_SPY", str(tmp_path / "absent"))
    sampler = StackSampler(fake_proc(tmp_path, TORCH_MAPS), every_s=1.0)
    for t in range(5):
        sampler.tick(float(t), LOOP, [snap(95.0)], stall=float(t))
        assert sampler._pending is None
    assert not sampler.samples and not sampler.stall_samples and not sampler.stall_sampling()


def test_under_a_wrapper_the_sampler_picks_the_torch_process_nearest_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sh -c "python train.py; ..."`: the root is a shell with no torch; below it the loop, its DataLoader
    workers (named pt_data_worker, or just forked and not renamed yet: the parent's command line) and a
    process of its own that also loads torch (deeper: not the loop)."""
    calls = fake_py_spy(tmp_path, monkeypatch)
    fake_proc(tmp_path, "7f00 r-xp /usr/lib/x86_64-linux-gnu/libc.so.6\n", DASH, "/usr/bin/dash")
    for pid in (PID, PID + 1, PID + 2, PID + 3, PID + 4):
        procfs = fake_proc(tmp_path, TORCH_MAPS, pid)
    tree = [
        member(PID + 1, PID, "python train.py", comm="pt_data_worker"),
        member(PID + 2, PID, "python train.py"),  # forked a moment ago
        member(PID + 3, PID, "python -c from multiprocessing.spawn import spawn_main; spawn_main(7)"),
        member(PID + 4, PID, "python eval.py --ckpt last.pt"),
        member(PID, DASH, "python train.py"),
        member(DASH, 1, 'sh -c "python train.py; echo done"', comm="sh"),
    ]
    sampler = StackSampler(procfs, every_s=10.0)
    sampler.tick(0.0, tree, [snap(95.0)])
    settle(sampler, 1.0, tree)
    assert dumped(calls) == [PID] and sampler.pid == PID and len(sampler.samples) == 1
    # the loop is held while it runs: its workers come and go, the maps are not read again
    for pid in (PID + 1, PID + 2, PID + 3, PID + 4):
        (tmp_path / "proc" / str(pid) / "maps").unlink()
    sampler.tick(10.0, tree[4:], [snap(95.0)])
    settle(sampler, 11.0, tree[4:])
    assert dumped(calls) == [PID, PID] and len(sampler.samples) == 2
    # it exits: the next pick is the torch process left nearest the root, with samples of its own
    fake_proc(tmp_path, TORCH_MAPS, PID + 4)
    rest = [tree[3], tree[5]]
    sampler.tick(20.0, rest, [snap(95.0)])
    assert not sampler.samples
    settle(sampler, 21.0, rest)
    assert dumped(calls) == [PID, PID, PID + 4] and sampler.pid == PID + 4 and len(sampler.samples) == 1


def test_the_loop_candidates_leave_out_workers_and_go_by_depth() -> None:
    tree = [
        member(30, 20, "python train.py", comm="pt_data_worker"),
        member(31, 20, "python train.py"),
        member(20, 10, "python train.py"),
        member(10, 1, "bash run.sh"),
        member(11, 10, "tee log.txt"),
    ]
    assert [m.pid for m in loop_candidates(tree)] == [10, 11, 20]
    # a fork of a shell is a subshell, not a worker; a loop of parents does not hang the depth
    cycle = [member(40, 41, "sh x"), member(41, 40, "sh y")]
    assert sorted(m.pid for m in loop_candidates(cycle)) == [40, 41]


def test_a_stall_is_dumped_once_busy_or_not_torch_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_py_spy(tmp_path, monkeypatch)
    procfs = fake_proc(tmp_path, NUMPY_MAPS)  # a Python job without torch, idle in its pause
    sampler = StackSampler(procfs, every_s=10.0)
    sampler.tick(0.0, LOOP, [snap(2.0)])
    assert sampler._pending is None and not sampler.stall_sampling()
    sampler.tick(4.0, LOOP, [snap(2.0)], stall=0.5)  # the counter stood still since its move at 0.5 s
    settle(sampler, 5.0)
    assert dumped(calls) == [PID] and not sampler.samples
    [sample] = sampler.stall_samples
    assert (sample.at, sample.stall_at, sample.frames) == (4.0, 0.5, WAITING)
    assert sampler.stall_sampling()
    for t in (6.0, 7.0, 8.0):  # the same stall: no second dump
        sampler.tick(t, LOOP, [snap(2.0)], stall=0.5)
        assert sampler._pending is None
    sampler.tick(30.0, LOOP, [snap(2.0)], stall=20.0)  # the next one
    settle(sampler, 31.0)
    assert [s.stall_at for s in sampler.stall_samples] == [0.5, 20.0] and dumped(calls) == [PID, PID]


def test_a_stall_of_a_process_that_is_not_python_is_not_dumped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_py_spy(tmp_path, monkeypatch)
    procfs = fake_proc(tmp_path, "7f00 r-xp /usr/lib/x86_64-linux-gnu/libstdc++.so.6\n", exe="/opt/train")
    sampler = StackSampler(procfs, every_s=10.0)
    job = [member(PID, 1, "/opt/train --steps 1000")]
    sampler.tick(4.0, job, [snap(2.0)], stall=0.5)
    assert sampler._pending is None and dumped(calls) == [] and not sampler.stall_sampling()
    # an interpreter embedded in it (libpython mapped) is Python enough for py-spy
    fake_proc(tmp_path, "7f00 r-xp /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0\n", exe="/opt/train")
    sampler.tick(9.0, job, [snap(2.0)], stall=6.0)
    settle(sampler, 10.0, job)
    assert dumped(calls) == [PID] and [s.stall_at for s in sampler.stall_samples] == [6.0]


# --- sooner while the job starts to look slow (a burst), then back to the steady interval ---------------


def dumps_at(
    sampler: StackSampler, calls: Path, until: int, suspected: Callable[[int], bool], start: int = 0
) -> list[int]:
    """Ticks once a second from `start` up to `until`, the speed watch's word each 4 s (`suspected(t)`):
    when py-spy was asked for a dump."""
    at = []
    for t in range(start, until):
        before = len(dumped(calls))
        if t % 4 == 0:
            sampler.suspect(float(t), suspected(t))
        sampler.tick(float(t), LOOP, [snap(95.0)])
        settle(sampler, float(t) + 0.5)
        if len(dumped(calls)) > before:
            at.append(t)
    return at


def test_a_job_that_starts_to_look_slow_is_sampled_every_2s_for_a_burst_then_every_10s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_py_spy(tmp_path, monkeypatch)
    sampler = StackSampler(fake_proc(tmp_path, TORCH_MAPS))  # the default interval
    assert sampler.every_s == STACK_EVERY_S == 10.0
    at = dumps_at(sampler, calls, 200, lambda t: 40 <= t < 100)
    assert [t for t in at if t < 40] == [0, 10, 20, 30]  # steady
    burst = [t for t in at if 40 <= t < 64]
    assert burst == list(range(40, 64, 2)) and len(burst) == BURST_DUMPS  # at once, then every 2 s
    after = [t for t in at if t >= 64]
    assert all(b - a == 10 for a, b in itertools.pairwise(after))  # back to the steady interval
    # the budget: it looks slow again within BURST_GAP_S of that burst: no second burst, the steady pace
    again = dumps_at(sampler, calls, 300, lambda t: t >= 220, start=200)
    assert all(b - a == 10 for a, b in itertools.pairwise(again)) and len(again) == 10


def test_a_job_that_always_looks_alike_is_sampled_at_the_steady_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_py_spy(tmp_path, monkeypatch)
    never = StackSampler(fake_proc(tmp_path, TORCH_MAPS))
    assert len(dumps_at(never, calls, 600, lambda t: False)) == 60  # ten minutes: one dump per 10 s
    # suspected from the start and for ever (a GPU job without workers beside idle CPUs): one burst, then
    # the steady interval: a burst's extra dumps at most once per BURST_GAP_S
    calls.unlink()
    always = StackSampler(fake_proc(tmp_path, TORCH_MAPS))
    at = dumps_at(always, calls, 1200, lambda t: True)
    assert len(at) <= 120 + 2 * BURST_DUMPS and at[:BURST_DUMPS] == list(range(0, 2 * BURST_DUMPS, 2))
    assert len([t for t in at if t >= 2 * BURST_DUMPS]) <= 120


def test_the_counters_that_make_the_stacks_worth_a_closer_look() -> None:
    assert not worth_sampling(HEALTHY)  # a compute-bound job that fills its CPUs
    # its DataLoader's workers start to work hard (half of what input-bound asks of them)
    assert worth_sampling(replace(HEALTHY, loader_workers=2, loader_worker_cpu=0.6))
    assert not worth_sampling(replace(HEALTHY, loader_workers=2, loader_worker_cpu=0.2))
    # no workers, one loop busy beside idle CPUs: the shape of data-loading-in-main
    assert worth_sampling(replace(HEALTHY, cpus=4.0, cpu_s=20.0))
    assert not worth_sampling(replace(HEALTHY, cpus=4.0, cpu_s=4.0))  # hardly busy: a sleep-bound loop
    # its step rate fell in the newest stretch
    steady = [Segment(float(i), 10 * i, 2.0, 5.0) for i in range(6)]
    assert not worth_sampling(replace(HEALTHY, segments=tuple(steady)))
    assert worth_sampling(replace(HEALTHY, segments=(*steady, Segment(6.0, 60, 0.8, 5.0))))


def test_a_burst_waits_for_torch_but_not_for_ever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_py_spy(tmp_path, monkeypatch)
    procfs = fake_proc(tmp_path, NUMPY_MAPS)  # busy, torch not loaded yet (importing it)
    sampler = StackSampler(procfs)
    sampler.suspect(0.0, True)
    for t in range(10):
        sampler.tick(float(t), LOOP, [snap(95.0)])
    assert dumped(calls) == []
    fake_proc(tmp_path, TORCH_MAPS)  # torch loaded: the burst's dumps, 2 s apart
    at = dumps_at(sampler, calls, 20, lambda t: True, start=10)
    assert at == [10, 12, 14, 16, 18]
    # a job that never loads torch: the burst ends after BURST_S, and the maps are read every 10 s again
    other = StackSampler(fake_proc(tmp_path, NUMPY_MAPS))
    other.suspect(0.0, True)
    reads = []
    monkeypatch.setattr(other, "_pick_loop", lambda members: reads.append(1) or False)
    for t in range(int(BURST_S) + 100):
        other.tick(float(t), LOOP, [snap(95.0)])
    assert len(reads) <= BURST_S / 2 + 1 + 100 / 10 + 1

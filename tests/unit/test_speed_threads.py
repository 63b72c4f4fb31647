"""worker-respawn and gil-bound (rules.speed.threads) on recorded evidence: each fires on its cause with the
share it costs and stays silent on its look-alikes (workers kept between epochs, a pool that grows, a
shell's subshells; one busy thread, native threads on two CPUs or waiting for the second on a loaded
machine, a partly idle process, one CPU). Then the shim's side over a /proc of files: batches of workers
from the tree's members, per-thread reads only for a busy multi-threaded process, and the task parser
(property test: outside input)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.model import ProcessId, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS, parse_schedstat, parse_voluntary_switches
from jobwarden.rules.speed import judge
from jobwarden.rules.speed.evidence import StepMove, ThreadsRead, ThreadUse, WorkerBatch
from jobwarden.rules.speed.threads import command_key, gil_bound, worker_kind, worker_respawn
from jobwarden.shim.tree.jobtree import Member
from jobwarden.shim.watch.speedwatch import READ_EVERY_S
from jobwarden.store import Store

from .test_rules import assert_well_formed
from .test_speed_rules import HEALTHY
from .test_speedwatch import FakeProc, member, store, watch_for  # noqa: F401  (store: a fixture)

SPAWN = (
    "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=N) "
    "--multiprocessing-fork"
)


def batches(
    n: int, every: float = 10.0, count: int = 2, ended: bool = True, startup: float = 1.9
) -> list[WorkerBatch]:
    return [
        WorkerBatch(100, SPAWN, "spawn", i * every, count, (i + 1) * every - 0.5 if ended else None, startup)
        for i in range(n)
    ]


# --- worker-respawn -------------------------------------------------------------------------------------


def test_workers_started_anew_every_epoch_are_worker_respawn_costed_by_their_start_up() -> None:
    ev = replace(HEALTHY, worker_batches=tuple(batches(4)))
    f = worker_respawn(ev)
    assert f is not None
    assert_well_formed([f])
    assert f.rule == "worker-respawn" and f.pids == (100,)
    # three respawns over 30 s, 1.9 s each: 19 %
    assert f.title == "DataLoader workers started anew every 10s: about 1.9s lost each time (19% of the time)"
    assert f.severity == "info"
    assert "persistent_workers=True" in f.remedy and "multiprocessing_context='fork'" in f.remedy
    assert f.evidence[0].startswith("pid 100 started 4 batches of 2 workers (spawn)")
    assert [f.rule for f in judge(ev)] == ["worker-respawn"]


def test_the_step_clock_measures_a_respawn_when_it_shows_it() -> None:
    # a step every 0.1 s, and 4 s from each batch's birth to the next step: 3.9 s lost of every 6 s
    moves = []
    for epoch in range(4):
        born = epoch * 6.0
        moves += [StepMove(born + 4.0 + 0.1 * i, epoch * 100 + i) for i in range(20)]
    ev = replace(HEALTHY, worker_batches=tuple(batches(4, every=6.0, startup=0.3)), moves=tuple(moves))
    f = worker_respawn(ev)
    assert f is not None and f.severity == "warning"
    assert "about 3.9s lost each time (65% of the time)" in f.title, f.title
    assert "(step clock)" in f.evidence[1]
    # the newest batch has no step after it yet: its start-up CPU is shown, the step clock's cost is said
    moves = moves[:-20]
    f = worker_respawn(replace(ev, moves=tuple(moves)))
    assert f is not None and "about 3.9s lost each time (65% of the time)" in f.title, f.title
    assert "about 0.3s lost (start-up CPU)" in f.evidence[-2]


@pytest.mark.parametrize(
    "what",
    [
        tuple(batches(1)),  # persistent workers: one batch for the whole run
        tuple(batches(2)),  # one restart is not a habit
        tuple(batches(4, ended=False)),  # a pool that grows: the old workers still run
        tuple(replace(b, parent_pid=100 + i) for i, b in enumerate(batches(4))),  # different parents
        tuple(replace(b, command=f"{SPAWN} {i}x") for i, b in enumerate(batches(4))),  # different commands
        (),
    ],
)
def test_no_worker_respawn_without_batches_replacing_ended_ones(what: tuple[WorkerBatch, ...]) -> None:
    assert worker_respawn(replace(HEALTHY, worker_batches=what)) is None


def test_a_gap_between_the_old_batch_ending_and_the_new_one_breaks_the_run() -> None:
    b = batches(4)
    b[2] = replace(b[2], ended_at=None)  # the third batch outlived the fourth's birth: not a respawn run
    assert worker_respawn(replace(HEALTHY, worker_batches=tuple(b))) is None


def test_worker_kinds_are_python_workers_only() -> None:
    spawn = SPAWN.replace("pipe_handle=N", "pipe_handle=9")
    assert worker_kind(spawn, "python train.py") == "spawn"
    assert (
        worker_kind("python -c from multiprocessing.forkserver import main; main(5, 6)", "python t.py")
        == "forkserver"
    )
    assert worker_kind("/usr/bin/python3 train.py", "/usr/bin/python3 train.py") == "fork"
    assert worker_kind("bash train.sh", "bash train.sh") is None  # a shell's subshells
    assert worker_kind("python eval.py", "bash train.sh") is None  # a tool the job runs in a loop
    assert worker_kind("python train.py --lr 1", "python train.py") is None


@given(st.text(max_size=200), st.text(alphabet="0123456789", min_size=1, max_size=6))
def test_command_key_blanks_numbers_only(text: str, number: str) -> None:
    key = command_key(text)
    assert not any(c in "0123456789" for c in key)
    assert command_key(key) == key
    assert command_key(f"{text} pipe_handle={number}") == command_key(f"{text} pipe_handle=7")


# --- gil-bound ------------------------------------------------------------------------------------------


Use = tuple[float, float, float]  # a thread's CPU, run delay (CPUs' worth), voluntary switches a second


def reads(threads: tuple[Use, ...], n: int = 5, pid: int = 100) -> tuple[ThreadsRead, ...]:
    used = tuple(ThreadUse(*t) for t in threads)
    return tuple(ThreadsRead(pid, 2.0, used, "python train.py") for _ in range(n))


GIL = ((0.51, 0.02, 140.0), (0.47, 0.02, 150.0), (0.01, 0.0, 2.0))  # two spinning threads and an idle main


def test_two_python_threads_on_one_cpu_of_two_are_gil_bound() -> None:
    ev = replace(HEALTHY, thread_reads=reads(GIL))
    f = gil_bound(ev)
    assert f is not None
    assert_well_formed([f])
    assert f.title == "2 Python threads share one CPU (the GIL): 0.98 CPUs used of 2 it could use"
    assert f.severity == "warning"  # half of what two threads could do
    assert f.pids == (100,)
    assert f.evidence[0].startswith("pid 100: 2 busy threads used 0.98 CPUs together over 10s")
    assert "140 sleeps/s" in f.evidence[1]
    assert "gil-bound" in [x.rule for x in judge(ev)]


def test_a_gil_bound_process_on_a_loaded_machine_is_still_gil_bound() -> None:
    # measured at load 6-7 on 2 cores: 0.29 CPU each, 0.4 waiting each, 130-150 sleeps a second each
    assert (
        gil_bound(replace(HEALTHY, thread_reads=reads(((0.29, 0.44, 132.0), (0.29, 0.42, 139.0)))))
        is not None
    )


@pytest.mark.parametrize(
    "threads",
    [
        ((0.98, 0.02, 3.0), (0.01, 0.0, 50.0)),  # one busy thread
        ((0.97, 0.02, 3.0), (0.1, 0.01, 100.0)),  # a busy thread and a logger's
        ((0.98, 0.02, 1.0), (0.97, 0.03, 0.0)),  # native threads on two CPUs (a matmul's intra-op pool)
        (
            (0.34, 0.66, 1.0),
            (0.32, 0.67, 0.0),
        ),  # the same measured on a loaded machine: preempted, never asleep
        ((0.15, 0.02, 90.0), (0.12, 0.02, 80.0)),  # partly idle: waits on I/O, wants little CPU
        ((0.9, 0.05, 150.0), (0.85, 0.05, 140.0)),  # threads that sleep often yet use two CPUs
        # an fsync loop's two threads on a loaded machine (CI): the writer sleeps on the disk, far more
        # often than the GIL can change hands
        ((0.51, 0.41, 22.0), (0.41, 0.45, 770.0)),
    ],
)
def test_no_gil_bound_where_threads_do_not_take_turns_on_one_cpu(threads: tuple[Use, ...]) -> None:
    assert gil_bound(replace(HEALTHY, thread_reads=reads(threads))) is None


def test_no_gil_bound_on_one_cpu_or_before_enough_reads_or_when_it_comes_and_goes() -> None:
    gil = reads(GIL)
    assert gil_bound(replace(HEALTHY, cpus=1.0, thread_reads=gil)) is None
    assert gil_bound(replace(HEALTHY, thread_reads=gil[:2])) is None
    mixed = reads(GIL, n=2) + reads(((0.98, 0.02, 1.0), (0.97, 0.03, 0.0)), n=3)
    assert gil_bound(replace(HEALTHY, thread_reads=mixed)) is None


# --- the shim's side ------------------------------------------------------------------------------------


def worker(pid: int, start: int, parent: int = 1000) -> Member:
    cmd = SPAWN.replace("pipe_handle=N", f"pipe_handle={pid}")
    m = Member(ProcessId(pid, start), -1, parent, cmd)
    m.last_ticks = 150
    return m


def test_the_watch_groups_workers_into_batches_and_notes_when_each_ended(
    tmp_path: Path,
    store: tuple[Store, int, int],  # noqa: F811
) -> None:
    proc = FakeProc(tmp_path / "proc")
    watch = watch_for(store, proc)
    main = member(1000, "S")
    main.cmdline = "python train.py"
    shell = Member(ProcessId(1500, 1), -1, 1000, "bash -c ls")  # not a Python worker
    t, pid = 0.0, 2000
    for epoch in range(3):
        kids = [worker(pid, 1000 + epoch), worker(pid + 1, 1000 + epoch)]
        pid += 2
        for _ in range(5):
            watch._note_workers(t, [main, shell, *kids])
            t += 1.0
    watch._note_workers(t, [main])
    got = [b for _, b in watch._batches]
    assert [(b.born_at, b.count, b.ended_at, b.kind) for b in got] == [
        (0.0, 2, 5.0, "spawn"),
        (5.0, 2, 10.0, "spawn"),
        (10.0, 2, 15.0, "spawn"),
    ]
    assert all(b.parent_pid == 1000 and b.startup_cpu_s == 1.5 for b in got)  # 150 ticks at 100 Hz
    assert worker_respawn(replace(HEALTHY, worker_batches=tuple(got))) is not None
    assert not watch._kids


def test_an_epochs_workers_started_seconds_apart_on_a_loaded_machine_are_one_batch(
    tmp_path: Path,
    store: tuple[Store, int, int],  # noqa: F811
) -> None:
    """A spawned worker's start waits for the one before it to read its dataset: 1.5 s apart (150 ticks)."""
    watch = watch_for(store, FakeProc(tmp_path / "proc"))
    main = member(1000, "S")
    main.cmdline = "python train.py"
    first, second = worker(2000, 1000), worker(2001, 1150)
    watch._note_workers(0.0, [main, first])
    watch._note_workers(2.0, [main, first, second])
    watch._note_workers(4.0, [main, worker(2002, 1400)])  # the next epoch's: the first batch has ended
    assert [(b.count, b.born_at) for _, b in watch._batches] == [(2, 0.0), (1, 4.0)]


def test_threads_are_read_only_for_a_busy_process_with_two_of_them(
    tmp_path: Path,
    store: tuple[Store, int, int],  # noqa: F811
) -> None:
    proc = FakeProc(tmp_path / "proc")
    watch = watch_for(store, proc)
    busy, idle = member(1000, "R"), member(1001, "S")
    fields = ["R", "1", *["0"] * 15, "2", "0", "500", *["0"] * 30]  # field 20: two threads
    busy.raw_stat = f"1000 (python) {' '.join(fields)}\n".encode()
    busy.snapshot = ProcessSnapshot(1000, 1, 500, "R", "python train.py", 1 << 20, 99.0)
    proc.process(1001, 0, 0)
    t = 0.0
    while t <= 10.0:
        proc.process(1000, int(t * 1e9), 0)
        for tid, share in ((1000, 0.5), (1003, 0.48)):  # two threads take turns on one CPU
            (proc.root / "1000" / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
            task = proc.root / "1000" / "task" / str(tid)
            task.joinpath("schedstat").write_text(f"{int(t * share * 1e9)} 1000 5\n")
            task.joinpath("status").write_text(f"Name:\tpython\nvoluntary_ctxt_switches:\t{int(t * 140)}\n")
        (proc.root / "1001" / "task").mkdir(exist_ok=True)  # never read: asleep, one thread
        watch.tick(T0 + t, t, [busy, idle], [], None)
        t += READ_EVERY_S
    ev = watch.evidence(t, [busy, idle])
    assert ev.thread_reads and {r.pid for r in ev.thread_reads} == {1000}
    last = ev.thread_reads[-1].threads
    assert [(u.cpu, u.sleeps) for u in last] == [pytest.approx((0.5, 140)), pytest.approx((0.48, 140))]
    assert gil_bound(replace(ev, cpus=2.0)) is not None


T0 = 1_700_000_000.0


@given(
    st.lists(
        st.tuples(st.integers(1, 99999), st.text(max_size=40), st.text(max_size=80)),
        max_size=6,
        unique_by=lambda x: x[0],
    )
)
def test_task_counters_keep_the_threads_whose_files_read(
    tmp_path_factory: pytest.TempPathFactory, tasks: list[tuple[int, str, str]]
) -> None:
    root = tmp_path_factory.mktemp("proc")
    (root / "7" / "task").mkdir(parents=True)
    for tid, sched, status in tasks:
        (root / "7" / "task" / str(tid)).mkdir()
        (root / "7" / "task" / str(tid) / "schedstat").write_text(sched)
        (root / "7" / "task" / str(tid) / "status").write_text(status)
    got = ProcFS(root).task_counters(7)
    for tid, sched, status in tasks:
        try:
            parse_schedstat(sched), parse_voluntary_switches(status)
        except ValueError:
            assert tid not in got
        else:
            assert got[tid].exec_ns == parse_schedstat(sched).exec_ns


@given(st.text(max_size=200), st.integers(0, 10**12))
def test_voluntary_switches_are_found_among_any_lines_or_refused(text: str, n: int) -> None:
    line = f"voluntary_ctxt_switches:\t{n}"
    assert parse_voluntary_switches(f"Name:\tpy\n{line}\nnonvoluntary_ctxt_switches:\t3\n") == n
    try:
        got = parse_voluntary_switches(text)
    except ValueError as err:
        assert str(err)  # refused with a reason, never another exception
    else:
        assert got >= 0 and str(got) in text

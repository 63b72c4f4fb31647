"""The hang family on stacks recorded from real reproducers (tests/fixtures/stacks, see record.py there):
each rule where it fires, and the healthy or look-alike cases where it must not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobwarden.observations import Frame, ProcessDeath, ProcessFacts, ProcessStack, ThreadStack
from jobwarden.rules import RunEvidence, explain
from tests.fixtures.stacks.pyspy import recording

from .test_rules import assert_well_formed, rules_of

FORK_SCENARIOS = ["fork_os", "fork_mp", "fork_os_py38", "fork_mp_py38", "fork_os_py313", "fork_mp_py313"]
HEALTHY = ["cpu_bound", "heartbeat", "sleeping_child"]


def native_frame(function: str, lib: str = "libpython3.11.so.1.0") -> Frame:
    return Frame(function, f"/usr/lib/{lib}", None, native=True)


def py_frame(function: str, file: str, line: int) -> Frame:
    return Frame(function, file, line)


# --- fork-deadlock --------------------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False], ids=["native", "python-only"])
@pytest.mark.parametrize("name", FORK_SCENARIOS)
def test_fork_deadlock_on_every_recorded_python(name: str, native: bool) -> None:
    rec = recording(name)
    findings = explain(rec.evidence(native=native))
    assert rules_of(findings) == ["fork-deadlock"]
    (f,) = findings
    child, parent = rec.pid("child"), rec.pid("parent")
    assert f.pids == (child,)
    assert f.severity == "critical"
    assert f"forked from pid {parent} while 1 other thread ran" in f.summary
    assert f.evidence[0].startswith(f"pid {child} (")
    how = "native frame lock_PyThread_acquire_lock" if native else "asleep on a futex (wchan futex_do_wait)"
    assert how in f.evidence[0]
    (site,) = [e for e in f.evidence if e.startswith(f"forked by pid {parent} at ")]
    assert "the fork hook's record" in site
    assert any(e.startswith("threads alive at the fork: thread 'holder'") for e in f.evidence)
    assert any("'holder'" in e and "the likely holder" in e for e in f.evidence)
    assert_well_formed(findings)


def test_fork_deadlock_names_the_multiprocessing_fork_site_and_remedy() -> None:
    (f,) = explain(recording("fork_mp").evidence())
    (site,) = [e for e in f.evidence if e.startswith("forked by")]
    assert "at _launch (multiprocessing/popen_fork.py:" in site
    assert "called from <module> (" in site
    assert "load_shard (" in f.evidence[0]
    assert "--mp-start forkserver" in f.remedy
    assert "set_start_method('forkserver')" in f.remedy


def test_fork_deadlock_after_os_fork_does_not_offer_mp_start_as_the_fix() -> None:
    (f,) = explain(recording("fork_os").evidence())
    assert "os.fork()" in f.remedy
    assert "--mp-start does not reach a bare os.fork" in f.remedy


def test_fork_deadlock_quotes_the_python_312_warning() -> None:
    # 3.13's os.fork() warned on stderr; the recording kept the output
    (f,) = explain(recording("fork_os_py313").evidence())
    assert any("DeprecationWarning: This process" in e and "multi-threaded" in e for e in f.evidence)


def test_fork_deadlock_without_the_fork_hook_from_a_multiprocessing_stack() -> None:
    # --no-py-hooks: no ForkRecord; the child's stack shows multiprocessing's fork, the parent runs threads.
    rec = recording("fork_mp")
    (f,) = explain(rec.evidence(forks=()))
    assert f.rule == "fork-deadlock"
    assert any("from its stack (multiprocessing's fork)" in e for e in f.evidence)
    assert any(e.startswith("threads alive at the fork: thread 'holder'") for e in f.evidence)


def test_fork_deadlock_without_the_fork_hook_after_a_bare_os_fork() -> None:
    # The stack no longer shows the fork; the shared command line with a threaded parent does.
    (f,) = explain(recording("fork_os").evidence(forks=()))
    assert f.rule == "fork-deadlock"
    assert any("its command line, the same as pid" in e for e in f.evidence)


def test_fork_deadlock_record_matched_by_start_time_when_the_child_never_reported() -> None:
    rec = recording("fork_mp")
    forks = tuple(dataclasses.replace(r, child_pid=None) for r in rec.forks())
    (f,) = explain(rec.evidence(forks=forks))
    assert any("the fork hook's record" in e for e in f.evidence)


def test_fork_deadlock_inside_the_interpreters_after_fork_code() -> None:
    # gh-112275 (3.8-3.11): the child hangs in PyOS_AfterFork_Child on HEAD_LOCK. Frames as in that
    # report; no reproducer hung in 35,000 forks on this machine, so this stack is transcribed, not recorded.
    child = ProcessStack(
        5001,
        "py-spy --native",
        (
            ThreadStack(
                5001,
                "MainThread",
                (
                    native_frame("__futex_abstimed_wait_common", "libc.so.6"),
                    native_frame("PyThread_acquire_lock_timed", "libpython3.8.so.1.0"),
                    native_frame("_PyThreadState_DeleteExcept", "libpython3.8.so.1.0"),
                    native_frame("PyOS_AfterFork_Child", "libpython3.8.so.1.0"),
                    native_frame("os_fork_impl", "libpython3.8.so.1.0"),
                    py_frame("spawn_worker", "/srv/app/workers.py", 41),
                    py_frame("<module>", "/srv/app/main.py", 12),
                ),
                active=False,
            ),
        ),
    )
    ev = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=5000,
        hang_window_s=600.0,
        processes=(ProcessFacts(5001, 5000, "python main.py --worker", "S", ("S",), "futex_do_wait"),),
        stacks=(child,),
    )
    (f,) = explain(ev)
    assert f.rule == "fork-deadlock"
    assert "CPython's own after-fork code" in f.summary
    assert "native frame PyOS_AfterFork_Child (libpython3.8.so.1.0)" in f.evidence[0]
    assert "gh-112275" in f.remedy


@pytest.mark.parametrize("name", FORK_SCENARIOS[:2])
def test_no_fork_deadlock_before_the_watchdog_judged_a_hang(name: str) -> None:
    assert explain(recording(name).evidence(hung=False)) == []


def test_no_fork_deadlock_when_no_other_thread_ran_at_the_fork() -> None:
    rec = recording("fork_mp")
    forks = tuple(dataclasses.replace(r, threads=()) for r in rec.forks())
    assert rules_of(explain(rec.evidence(forks=forks))) == ["no-progress"]


def test_a_lock_wait_in_a_process_that_was_not_forked_is_not_fork_deadlock() -> None:
    # ABBA deadlock between two threads of one process: a hang, not fork's doing.
    assert rules_of(explain(recording("deadlock").evidence())) == ["no-progress"]


def test_a_forked_child_that_sleeps_is_not_fork_deadlock() -> None:
    # The fork hook recorded a fork with a 'metrics' thread alive; the child just sleeps.
    rec = recording("sleeping_child")
    assert rec.forks() and rec.forks()[0].threads
    assert "fork-deadlock" not in rules_of(explain(rec.evidence()))


def test_an_idle_pool_worker_waiting_for_the_queue_lock_is_not_fork_deadlock() -> None:
    # worker0 waits in SemLock.__enter__ (multiprocessing/synchronize.py) while its sibling reads the task
    # queue: a lock wait in a process forked from a threaded parent, held by a live process. Healthy.
    rec = recording("pool_sigkill")
    ev = rec.evidence(deaths=())  # judge the workers alone, not the lost one
    assert "SemLock.__enter__" in rec.stack("worker0").threads[0].frames[0].function
    assert "fork-deadlock" not in rules_of(explain(ev))


# --- pool-worker-lost -----------------------------------------------------------------------------


@pytest.mark.parametrize("hung", [False, True], ids=["at-once", "hung"])
def test_pool_worker_lost(hung: bool) -> None:
    rec = recording("pool_sigkill")
    findings = explain(rec.evidence(hung=hung))
    assert rules_of(findings) == ["pool-worker-lost"]  # and no no-progress on top: this explains the hang
    (f,) = findings
    (dead,) = rec.deaths()
    parent = rec.pid("parent")
    assert f.pids == (dead.pid, parent)
    assert f.title == f"Pool worker {dead.pid} died; pid {parent} waits forever for its result"
    assert "waits in Pool.map (multiprocessing/pool.py:" in f.summary
    assert "bpo-22393" in f.summary
    assert any(e.startswith(f"worker pid {dead.pid} (") and "was killed by SIGKILL" in e for e in f.evidence)
    (wait,) = [e for e in f.evidence if e.startswith(f"parent pid {parent} is alive")]
    assert "thread 'MainThread'" in wait and "ApplyResult.get (multiprocessing/pool.py:" in wait
    replacement = rec.pid("replacement")
    assert any(
        e.startswith(f"pid {replacement} is the worker the pool started in its place") for e in f.evidence
    )
    assert "ProcessPoolExecutor" in f.remedy and "BrokenProcessPool" in f.remedy and "timeout" in f.remedy
    assert_well_formed(findings)


def test_pool_worker_lost_to_the_oom_killer_puts_the_oom_first() -> None:
    from jobwarden.observations import OomEvidence

    rec = recording("pool_sigkill")
    (dead,) = rec.deaths()
    oom = OomEvidence("cgroup-v1", 1, limit_bytes=300 << 20, peak_bytes=299 << 20, victims=(dead.pid,))
    findings = explain(rec.evidence(hung=False, oom=oom))
    assert rules_of(findings) == ["oom-kill", "pool-worker-lost"]
    lost = findings[1]
    assert "was killed by the OOM killer (SIGKILL)" in lost.summary
    assert any("(see oom-kill)" in e for e in lost.evidence)
    assert lost.remedy.startswith("Give the workers the memory they need")


def test_workers_that_exit_normally_are_not_lost() -> None:
    # maxtasksperchild=1: two workers exited 0 while the parent waits in Pool.map. Normal churn.
    rec = recording("pool_maxtasks")
    assert all(d.exit_code == 0 and d.signal is None for d in rec.deaths())
    assert explain(rec.evidence(hung=False)) == []


def test_no_pool_worker_lost_when_the_parent_is_gone_too() -> None:
    rec = recording("pool_sigkill")
    alive = tuple(p for p in rec.evidence().processes if p.pid != rec.pid("parent"))
    assert "pool-worker-lost" not in rules_of(explain(rec.evidence(hung=False, processes=alive)))


def test_no_pool_worker_lost_when_the_parent_does_not_wait_on_the_pool() -> None:
    # A child killed while its parent computes (sleeping_child's parent): a death, not a lost pool task.
    rec = recording("sleeping_child")
    death = ProcessDeath(rec.pid("child"), rec.pid("parent"), "python", 1.0, None, "SIGKILL")
    alive = (rec.process("parent"),)
    assert explain(rec.evidence(hung=False, deaths=(death,), processes=alive)) == []


def test_pool_worker_lost_in_a_process_pool_executor() -> None:
    wait = ThreadStack(
        7000,
        "MainThread",
        (
            py_frame("Condition.wait", "/usr/lib/python3.11/threading.py", 320),
            py_frame("Future.result", "/usr/lib/python3.11/concurrent/futures/_base.py", 451),
            py_frame("main", "/srv/etl.py", 30),
        ),
        active=False,
    )
    manager = ThreadStack(
        7003,
        "Thread-1",
        (py_frame("_ExecutorManagerThread.run", "/usr/lib/python3.11/concurrent/futures/process.py", 335),),
    )
    ev = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=7000,
        processes=(ProcessFacts(7000, 1, "python /srv/etl.py", "S", is_main=True),),
        deaths=(ProcessDeath(7001, 7000, "python /srv/etl.py", 2.0, None, "SIGKILL"),),
        stacks=(ProcessStack(7000, "py-spy", (wait, manager)),),
    )
    (f,) = explain(ev)
    assert f.rule == "pool-worker-lost"
    assert "BrokenProcessPool" in f.summary


def test_a_thread_pools_future_wait_is_not_a_lost_process_worker() -> None:
    wait = ThreadStack(
        7000, "MainThread", (py_frame("Future.result", "/lib/python3.11/concurrent/futures/_base.py", 451),)
    )
    ev = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=7000,
        processes=(ProcessFacts(7000, 1, "python /srv/etl.py", "S", is_main=True),),
        deaths=(ProcessDeath(7001, 7000, "curl", 2.0, 7, None),),  # a subprocess it ran, failed
        stacks=(ProcessStack(7000, "py-spy", (wait,)),),
    )
    assert explain(ev) == []


# --- dataloader-worker-killed ---------------------------------------------------------------------


TORCH = "/v/lib/python3.11/site-packages/torch"


def dataloader_failure(*lines: str, **changes: Any) -> RunEvidence:
    base = RunEvidence(
        state="failed",
        exit_code=1,
        signal=None,
        end_reason="exited",
        pid=8000,
        log_tail=("Traceback (most recent call last):", '  File "train.py", line 9, in <module>', *lines),
    )
    return dataclasses.replace(base, **changes)


def test_dataloader_worker_killed_by_the_oom_killer() -> None:
    from jobwarden.observations import OomEvidence

    line = "RuntimeError: DataLoader worker (pid 8003) is killed by signal: Killed. "
    ev = dataloader_failure(line, oom=OomEvidence("cgroup-v2", 1, victims=(8003,)))
    findings = explain(ev)
    assert rules_of(findings) == ["oom-kill", "dataloader-worker-killed", "python-exception"]
    dl = findings[1]
    assert dl.title == "DataLoader worker pid 8003 died (SIGKILL)"
    assert "was killed by the OOM killer" in dl.summary
    assert f"output: {line.strip()}" in dl.evidence
    assert "num_workers" in dl.remedy
    assert dl.pids == (8003,)
    assert_well_formed(findings)


def test_dataloader_bus_error_points_at_shared_memory() -> None:
    ev = dataloader_failure(
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
        "memory (shm).",
        "RuntimeError: DataLoader worker (pid 8004) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
    )
    dl = explain(ev)[0]
    assert dl.rule == "dataloader-worker-killed"
    assert dl.title == "DataLoader worker pid 8004 died (SIGBUS)"
    assert "--shm-size" in dl.remedy


def test_dataloader_worker_exited_unexpectedly() -> None:
    # measured in docs/measurements.md, "DataLoader worker killed" (torch 2.13, SIGKILL of a worker)
    ev = dataloader_failure("RuntimeError: DataLoader worker (pid(s) 30034) exited unexpectedly")
    dl = explain(ev)[0]
    assert dl.rule == "dataloader-worker-killed"
    assert dl.pids == (30034,)
    assert "num_workers=0" in dl.remedy


def test_dataloader_worker_death_seen_from_the_stacks() -> None:
    parent = ThreadStack(
        8000,
        "MainThread",
        (
            py_frame(
                "_MultiProcessingDataLoaderIter._try_get_data", f"{TORCH}/utils/data/dataloader.py", 1133
            ),
            py_frame("train", "/srv/train.py", 40),
        ),
        active=False,
    )
    ev = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=8000,
        processes=(ProcessFacts(8000, 1, "python /srv/train.py", "S", is_main=True),),
        deaths=(ProcessDeath(8005, 8000, "python /srv/train.py", 3.0, None, "SIGSEGV"),),
        stacks=(ProcessStack(8000, "py-spy", (parent,)),),
    )
    (dl,) = explain(ev)
    assert dl.rule == "dataloader-worker-killed"
    assert dl.title == "DataLoader worker pid 8005 died (SIGSEGV)"
    assert any("waits in _MultiProcessingDataLoaderIter._try_get_data" in e for e in dl.evidence)


# --- collective-hang: ranks from docs/measurements.md, "Collective hang" (torch 2.13 + gloo, no GPU) ---

C10D = f"{TORCH}/distributed/distributed_c10d.py"
RANK0 = ThreadStack(
    30093,
    "MainThread",
    (
        native_frame("pthread_cond_wait", "libc.so.6"),
        native_frame("std::condition_variable::wait", "libstdc++.so.6.0.30"),
        native_frame("c10d::Work::wait", "libtorch_cpu.so"),
        native_frame("pybind11::cpp_function::dispatcher", "libtorch_python.so"),
        py_frame("all_reduce", C10D, 3252),
        py_frame("_exception_logger.<locals>.wrapper", f"{TORCH}/distributed/c10d_logger.py", 83),
        py_frame("run", "/srv/collective_hang.py", 10),
    ),
    active=False,
)
RANK1 = ThreadStack(30094, "MainThread", (py_frame("run", "/srv/collective_hang.py", 12),), active=False)


def ranks(**changes: Any) -> RunEvidence:
    base = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=30090,
        hang_window_s=600.0,
        processes=(
            ProcessFacts(30090, 1, "python collective_hang.py", "S", is_main=True),
            ProcessFacts(30093, 30090, "python collective_hang.py (rank 0)", "S"),
            ProcessFacts(30094, 30090, "python collective_hang.py (rank 1)", "S"),
        ),
        stacks=(ProcessStack(30093, "py-spy --native", (RANK0,)), ProcessStack(30094, "py-spy", (RANK1,))),
    )
    return dataclasses.replace(base, **changes)


def test_collective_hang_names_the_rank_that_is_elsewhere() -> None:
    findings = explain(ranks())
    assert rules_of(findings) == ["collective-hang"]
    (f,) = findings
    assert f.title == "Hung in all_reduce: the ranks disagree"
    assert "pid 30094 is elsewhere" in f.summary
    assert (
        "pid 30093 waits in all_reduce (torch/distributed/distributed_c10d.py:3252), called from "
        "run (/srv/collective_hang.py:10)"
    ) in f.evidence
    assert any(e.startswith("pid 30094 (") and "run (/srv/collective_hang.py:12)" in e for e in f.evidence)
    assert f.remedy.startswith("Start with pid 30094")
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in f.remedy
    assert f.pids == (30094, 30093)  # the rank that is elsewhere first: the finding is about it
    assert_well_formed(findings)


def test_collective_hang_with_every_local_rank_waiting() -> None:
    rank1 = dataclasses.replace(RANK0, tid=30094)
    ev = ranks(stacks=(ProcessStack(30093, "py-spy", (RANK0,)), ProcessStack(30094, "py-spy", (rank1,))))
    (f,) = explain(ev)
    assert f.title == "Hung in all_reduce"
    assert "another machine" in f.summary


def in_collective(tid: int, op: str, line: int, script_line: int) -> ThreadStack:
    frames = (native_frame("c10d::Work::wait", "libtorch_cpu.so"), py_frame(op, C10D, line))
    return dataclasses.replace(
        RANK0, tid=tid, frames=(*frames, py_frame("run", "/srv/train.py", script_line))
    )


def ranked(*ops: str) -> RunEvidence:
    """Every rank in a collective, rank r in ops[r] (no flight recorder: the stacks alone)."""
    pids = [30093 + r for r in range(len(ops))]
    processes = [ProcessFacts(30090, 1, "torchrun train.py", "S", is_main=True)]
    processes += [ProcessFacts(pid, 30090, "python train.py", "S", rank=r) for r, pid in enumerate(pids)]
    stacks = [
        ProcessStack(pid, "py-spy --native", (in_collective(pid, op, 3000 + r, 40 + r),))
        for r, (pid, op) in enumerate(zip(pids, ops, strict=True))
    ]
    return ranks(processes=tuple(processes), stacks=tuple(stacks))


def test_stacks_alone_a_rank_in_another_collective_is_the_lead() -> None:
    # rank 1 in broadcast, rank 0 in all_reduce: "2 ranks wait in all_reduce" contradicted the evidence
    (f,) = explain(ranked("all_reduce", "broadcast"))
    assert f.title == "Rank 1 waits in broadcast where rank 0 waits in all_reduce"
    assert f.rank == 1 and f.pids == (30094, 30093)
    assert "1 rank waits in all_reduce while rank 1 waits in another collective" in f.summary
    assert f.evidence[0].startswith("pid 30094 (rank 1) waits in broadcast (")
    assert f.remedy.startswith("Start with rank 1 (pid 30094)")


def test_stacks_alone_the_fewer_ranks_in_another_collective_are_the_lead() -> None:
    (f,) = explain(ranked("all_reduce", "all_reduce", "barrier"))
    assert f.title == "Rank 2 waits in barrier where ranks 0 and 1 wait in all_reduce"
    assert f.rank == 2 and f.pids[0] == 30095


def test_nccl_watchdog_timeout_in_the_output_fires_after_the_end() -> None:
    line = (
        "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=5000) ran for 5096 "
        "milliseconds before timing out."
    )
    ev = RunEvidence(
        state="failed", exit_code=None, signal="SIGABRT", end_reason="signalled", pid=30090, log_tail=(line,)
    )
    findings = explain(ev)
    assert rules_of(findings) == ["collective-hang", "native-crash"]
    assert findings[0].evidence == (f"output: {line}",)


def test_no_collective_hang_before_the_watchdog_judged_a_hang() -> None:
    # a collective is also where healthy ranks spend their time
    assert explain(ranks(hang_window_s=None)) == []


# --- process-stopped ------------------------------------------------------------------------------


def test_process_stopped_fires_at_once_with_the_signal_from_pyspys_error() -> None:
    rec = recording("stopped")
    # The blocking dump failed and named SIGSTOP; keep that as the stack the probe got.
    ev = rec.evidence(hung=False, stacks=(rec.stack_error("main", "main.blocking"),))
    findings = explain(ev)
    assert rules_of(findings) == ["process-stopped"]
    (f,) = findings
    pid = rec.pid("main")
    assert f.title == f"pid {pid} stopped by SIGSTOP"
    assert "someone sent it SIGSTOP" in f.summary
    assert f.evidence[0].endswith("state T, wchan do_signal_stop, stop signal SIGSTOP")
    assert f.remedy.startswith(f"`kill -CONT {pid}` resumes it")
    assert_well_formed(findings)


def test_process_stopped_with_the_nonblocking_stack() -> None:
    rec = recording("stopped")
    (f,) = explain(rec.evidence(hung=False))
    assert f.title == f"pid {rec.pid('main')} stopped"
    assert "stopped at <module> (" in f.evidence[0]


def test_process_stopped_by_a_background_terminal_read() -> None:
    rec = recording("stopped")
    main = rec.process("main", stop_signal="SIGTTIN")
    (f,) = explain(rec.evidence(hung=False, processes=(main,)))
    assert "tried to read from its terminal while in the background" in f.summary
    assert "stdin from /dev/null" in f.remedy


def test_a_process_being_traced_is_not_stopped() -> None:
    # state t: a debugger or jobwarden's own py-spy holds it for a moment
    rec = recording("stopped")
    main = rec.process("main", state="t", thread_states=("t",))
    assert explain(rec.evidence(hung=False, processes=(main,))) == []


# --- uninterruptible-io ---------------------------------------------------------------------------


def test_uninterruptible_io_names_the_d_thread_and_its_wait() -> None:
    rec = recording("dstate")
    facts = rec.process("main")
    assert facts.state == "S" and "D" in facts.thread_states  # only the reader thread is in D
    findings = explain(rec.evidence())
    assert rules_of(findings) == ["uninterruptible-io"]
    (f,) = findings
    assert f.title == "Stuck in the kernel (D state) waiting on kernel_clone"
    assert "vfork" in f.summary
    (tid,) = [t for t, s in zip(facts.thread_ids, facts.thread_states, strict=True) if s == "D"]
    assert f"thread {tid} in D, wchan kernel_clone" in f.evidence[0]
    assert any(e.startswith(f"thread {tid} (ckpt-reader) is at read_checkpoint (") for e in f.evidence)
    assert_well_formed(findings)


def test_uninterruptible_io_on_nfs() -> None:
    facts = ProcessFacts(9000, 1, "python train.py", "D", ("D",), "rpc_wait_bit_killable", state_for_s=900.0)
    ev = RunEvidence("running", None, None, None, 9000, hang_window_s=600.0, processes=(facts,))
    (f,) = explain(ev)
    assert f.rule == "uninterruptible-io"
    assert "NFS server" in f.summary
    assert "thread 9000 in D, wchan rpc_wait_bit_killable for 15m00s" in f.evidence[0]
    assert "soft,timeo" in f.remedy


def test_a_brief_d_state_is_not_uninterruptible_io() -> None:
    facts = ProcessFacts(9000, 1, "python train.py", "D", ("D",), "io_schedule", state_for_s=0.4)
    ev = RunEvidence("running", None, None, None, 9000, hang_window_s=600.0, processes=(facts,))
    assert rules_of(explain(ev)) == ["no-progress"]


def test_no_uninterruptible_io_before_the_watchdog_judged_a_hang() -> None:
    assert explain(recording("dstate").evidence(hung=False)) == []


# --- no-progress ----------------------------------------------------------------------------------


def test_no_progress_on_a_lock_order_deadlock() -> None:
    rec = recording("deadlock")
    findings = explain(rec.evidence())
    assert rules_of(findings) == ["no-progress"]
    (f,) = findings
    assert f.title == "No progress for 12m34s"
    assert "lock-order deadlock" in f.summary
    assert f.evidence[0] == (
        "quiet for 12m34s (window 10m00s): no output, heartbeat, CPU, I/O or GPU work; the last sign of "
        "progress was output"
    )
    assert any(e.startswith("main thread of pid") and "Thread.join (threading.py:" in e for e in f.evidence)
    assert sum("waits on a lock at transfer (" in e for e in f.evidence) == 2
    assert "the job wrote no output" in f.evidence
    assert "one global order" in f.remedy
    assert_well_formed(findings)


def test_no_progress_without_a_lock_hint_for_a_single_waiting_thread() -> None:
    rec = recording("heartbeat")
    (f,) = explain(rec.evidence())
    assert f.rule == "no-progress"
    assert "lock-order" not in f.summary
    assert "jobwarden.heartbeat()" in f.remedy


def test_no_progress_points_at_a_thread_holding_the_gil_in_native_code() -> None:
    # docs/measurements.md, "GIL held by a C extension": a C extension deadlocked while holding the GIL
    holder = ThreadStack(
        19177,
        "MainThread",
        (native_frame("__lll_lock_wait", "libc.so.6"), native_frame("c_deadlock", "libcdeadlock.so")),
        active=False,
        owns_gil=True,
    )
    ticker = ThreadStack(19220, "ticker", (native_frame("take_gil"), py_frame("<lambda>", "/srv/t.py", 3)))
    stack = ProcessStack(19177, "py-spy", (holder, ticker))
    ev = RunEvidence("running", None, None, None, 19177, hang_window_s=60.0, stacks=(stack,))
    (f,) = explain(ev)
    assert f.rule == "no-progress"
    assert any("holds the GIL inside native code (__lll_lock_wait (libc.so.6))" in e for e in f.evidence)


@pytest.mark.parametrize("name", HEALTHY)
@pytest.mark.parametrize("native", [True, False], ids=["native", "python-only"])
def test_healthy_quiet_jobs_have_no_findings(name: str, native: bool) -> None:
    # CPU-bound with no output, heartbeats only, a sleeping child while the parent computes: the watchdog
    # sees progress (CPU, heartbeat), sets no hang window, and no rule may fire on the stacks alone.
    assert explain(recording(name).evidence(native=native, hung=False)) == []


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_stacks_match_no_signature_even_under_a_hang_window(name: str) -> None:
    # Were the watchdog wrong, the finding must stay the generic no-progress, never a named signature.
    assert rules_of(explain(recording(name).evidence())) == ["no-progress"]

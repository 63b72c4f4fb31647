"""Ranks of a distributed job (rules.speed.ranks, shim.watch.rankwatch): where a rank's main thread is from
its state and system call, `straggler` on built evidence — the rank the others wait for, how much slower, the
share of the job's time lost and that rank's own why — and silent where it must be: balanced ranks, ranks
that hardly wait, a blip, half the job slow, a CPU wait every rank shares. Then the rank watch over a /proc
of files: which processes are ranks, the shares it keeps, the rows of `status`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from jobwarden.model import ProcessId, ProcessSnapshot, Ranks
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.syscalls import NAMES as SYSCALL_NAMES
from jobwarden.rules.speed import judge
from jobwarden.rules.speed.evidence import Neighbour, RankView, SpeedEvidence, StackSample
from jobwarden.rules.speed.ranks import stack_where, straggler, where_of
from jobwarden.shim.tree.jobtree import Member
from jobwarden.shim.watch.rankwatch import WINDOW_S, RankHints, RankWatch, rank_processes

from .test_rules import assert_well_formed

BASE = SpeedEvidence(window_s=20.0, cpus=8.0, affinity_cpus=8, main_pid=100, pids=(100,))


def rank(n: int, collective: float, looks: int = 20, **more: object) -> RankView:
    rest = round(1.0 - collective, 6)
    shares = (("collective", collective), ("computing", rest))
    return RankView(rank=n, pid=200 + n, looks=looks, shares=shares, **more)  # type: ignore[arg-type]


def ranks(*views: RankView) -> SpeedEvidence:
    return replace(BASE, ranks=views)


# --- where a main thread is -------------------------------------------------------------------------


def test_where_a_main_thread_is_from_its_state_and_call() -> None:
    assert where_of("R", None, False) == ("computing", "running or runnable")
    assert where_of("D", "read", False)[0] == "io"
    assert where_of("S", "clock_nanosleep", False) == ("idle", "clock_nanosleep")
    assert where_of("S", "futex", False) == ("collective", "futex wait")
    # with DataLoader workers a wait may be on them: not said to be a collective
    assert where_of("S", "futex", True) == ("unknown", "futex wait")
    assert where_of("S", "pread64", False) == ("io", "pread64")
    assert where_of("S", "wait4", False) == ("unknown", "wait4")
    assert where_of("S", "running", False)[0] == "computing"  # it woke between its stat and syscall reads
    assert SYSCALL_NAMES["x86_64"][202] == "futex" and SYSCALL_NAMES["aarch64"][98] == "futex"


def test_a_stack_names_the_collective_or_the_dataloader() -> None:
    c10d = "/x/torch/distributed/distributed_c10d.py"
    sample = StackSample(0.0, (("wait", "<native>"), ("all_reduce", c10d), ("step", "train.py")))
    assert stack_where(sample) == ("collective", "all_reduce")
    gloo = StackSample(0.0, (("gloo::AllreduceOp::run", "libgloo.so"), ("step", "train.py")))
    assert stack_where(gloo) == ("collective", "gloo::AllreduceOp::run")
    loader = StackSample(0.0, (("_next_data", "/x/torch/utils/data/dataloader.py"), ("step", "t.py")))
    assert stack_where(loader) == ("data", "_next_data")
    assert stack_where(StackSample(0.0, (("step", "train.py"),))) is None


# --- straggler ----------------------------------------------------------------------------------------


def test_the_rank_the_others_wait_for_is_the_straggler() -> None:
    ev = ranks(rank(0, 0.5), rank(1, 0.55), rank(2, 0.05), rank(3, 0.45))
    f = straggler(ev)
    assert f is not None and f.rule == "straggler" and f.rank == 2 and f.pids[0] == 202
    # the others' median wait 0.5: its step is 1 / (1 - 0.5) = 2x theirs, half the job's time lost
    assert f.title == "Rank 2 is a straggler: about 2.0× slower per step than the others"
    assert "loses about 50% of its time" in f.summary and f.severity == "warning"
    assert "rank 2 (pid 202): in collectives 5% of 20 looks; computing 95%" in f.evidence
    assert sum(e.startswith("rank ") for e in f.evidence) == 4
    found = judge(ev)
    assert_well_formed(found)
    assert [g.rule for g in found] == ["straggler"]


def test_its_own_quota_is_its_why() -> None:
    slow = rank(1, 0.02, quota_cpus=0.1, throttled_share=0.85, cpu_used=0.1)
    f = straggler(ranks(rank(0, 0.8), slow, rank(2, 0.75)))
    assert f is not None and f.rank == 1
    assert "quota of 0.1 CPUs throttled it in 85% of the periods" in f.evidence[3]
    assert "Why: its cpu cgroup's quota of 0.1 CPUs" in f.summary and "quota" in f.remedy


def test_a_sleep_in_its_main_thread_is_its_why() -> None:
    shares = (("idle", 0.8), ("computing", 0.2))
    slow = RankView(1, 201, looks=20, shares=shares, idle_detail="clock_nanosleep")
    f = straggler(ranks(rank(0, 0.85), slow))
    assert f is not None and f.rank == 1 and f.pids == (201,)
    assert "its main thread slept in 80% of the looks (clock_nanosleep)" in f.evidence
    assert "slower per step" in f.title and "about 7×" in f.title


def test_a_cpu_wait_of_its_own_is_its_why_not_one_every_rank_shares() -> None:
    hog = Neighbour(pid=9, user="bob", cpu=0.9, cmdline="stress")
    waits = ranks(rank(0, 0.6, wait_share=0.1), rank(1, 0.05, wait_share=0.5))
    f = straggler(replace(waits, neighbours=(hog,)))
    assert f is not None and "waited for a CPU 50%" in f.evidence[2] and "pid 9 (bob)" in f.evidence[2]
    shared = straggler(ranks(rank(0, 0.6, wait_share=0.4), rank(1, 0.05, wait_share=0.5)))
    assert shared is not None and not any("waited for a CPU" in e for e in shared.evidence)


def test_its_memory_read_back_from_disk_is_its_why() -> None:
    """A rank whose pages are swapped out waits for them in D: its faults explain its "waited on storage"."""
    shares = (("io", 0.6), ("computing", 0.35), ("collective", 0.05))
    slow = RankView(1, 201, looks=20, shares=shares, majflt_per_s=420.0)
    f = straggler(ranks(rank(0, 0.7, majflt_per_s=2.0), slow, rank(2, 0.7)))
    assert f is not None and f.rank == 1
    why = "its memory was read back from disk: 420 major page faults a second (/proc/PID/stat; the others 1)"
    assert f"Why: {why}: swapped out or evicted." in f.summary, f.summary
    assert any("waited on storage in 60%" in e for e in f.evidence)
    assert "memory it uses" in f.remedy
    # every rank faulting alike (the node swaps for all): not this rank's why
    alike = straggler(ranks(rank(0, 0.7, majflt_per_s=300.0), slow, rank(2, 0.7, majflt_per_s=350.0)))
    assert alike is not None and not any("major page faults" in e for e in alike.evidence)
    # a few faults a second: none worth naming
    few = straggler(ranks(rank(0, 0.7), replace(slow, majflt_per_s=20.0)))
    assert few is not None and not any("major page faults" in e for e in few.evidence)


def test_balanced_ranks_have_no_straggler() -> None:
    assert straggler(ranks(*(rank(n, 0.4 + 0.02 * n) for n in range(8)))) is None
    # one rank a little less in its collectives: not half the others'
    assert straggler(ranks(rank(0, 0.5), rank(1, 0.5), rank(2, 0.3))) is None


def test_ranks_that_hardly_wait_have_no_straggler() -> None:
    # the others wait 15 %: below 1.3x, nothing worth naming
    assert straggler(ranks(rank(0, 0.15), rank(1, 0.16), rank(2, 0.0))) is None


def test_a_blip_is_no_straggler() -> None:
    assert straggler(ranks(rank(0, 0.6, looks=5), rank(1, 0.0, looks=5))) is None
    # lagging over the window, but in one half of it only (a start-up, a pause)
    assert straggler(ranks(rank(0, 0.6, halves=(0.6, 0.6)), rank(1, 0.2, halves=(0.4, 0.0)))) is None
    assert straggler(ranks(rank(0, 0.6, halves=(0.6, 0.6)), rank(1, 0.2, halves=(0.0, 0.4)))) is None
    assert straggler(ranks(rank(0, 0.6, halves=(0.6, 0.6)), rank(1, 0.1, halves=(0.1, 0.1)))) is not None
    assert straggler(ranks(rank(0, 0.6))) is None  # one rank alone
    assert straggler(BASE) is None


def test_a_rank_found_computing_that_ran_no_longer_is_no_straggler() -> None:
    """Seen in a CI-like run: two ranks alike, steps of half a millisecond, and 17 looks that found rank 0
    computing in 59 % and rank 1 in 6 %: "17x slower". A rank that computes more runs its main thread
    longer than the others' (schedstat); one that ran no longer was caught runnable, or by chance."""
    alike = ranks(rank(0, 0.41, looks=17, cpu_used=0.52), rank(1, 0.94, looks=17, cpu_used=0.50))
    assert straggler(alike) is None
    more = ranks(rank(0, 0.41, looks=17, cpu_used=0.90), rank(1, 0.94, looks=17, cpu_used=0.50))
    f = straggler(more)
    assert f is not None and f.rank == 0 and "Why: its main thread computed in 59% of the looks" in f.summary
    # run time not measured (no schedstat): the looks alone, as before
    assert straggler(ranks(rank(0, 0.41, looks=17), rank(1, 0.94, looks=17))) is not None


def test_half_the_job_slow_is_no_straggler() -> None:
    # four of eight far from their collectives: the job is slow, not one rank
    assert straggler(ranks(*(rank(n, 0.6 if n % 2 else 0.05) for n in range(8)))) is None


def test_two_stragglers_are_named_together() -> None:
    f = straggler(ranks(*(rank(n, 0.02 if n in (3, 5) else 0.6) for n in range(8))))
    assert f is not None and f.rank == 3 and f.pids == (203, 205)
    assert f.title.endswith("than the others (and rank 5)")


# --- the rank watch -----------------------------------------------------------------------------------


def rank_member(pid: int, n: int | None, state: str, ppid: int = 1, comm: str = "python") -> Member:
    ranked = Ranks(n, n, 0) if n is not None else None
    m = Member(ProcessId(pid, 500), -1, ppid, "python train.py", comm, ranked)
    m.snapshot = ProcessSnapshot(pid, ppid, 500, state, "python train.py", 1 << 20, 0.0)
    return m


def syscall(root: Path, pid: int, text: str) -> None:
    task = root / str(pid) / "task" / str(pid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "syscall").write_text(text)


def test_ranks_are_the_topmost_processes_carrying_one() -> None:
    agent = rank_member(10, None, "S")
    r0, r1 = rank_member(11, 0, "S", ppid=10), rank_member(12, 1, "S", ppid=10)
    worker = rank_member(13, 0, "S", ppid=11, comm="pt_data_worker")  # inherits RANK from rank 0
    assert rank_processes([worker, r1, agent, r0]) == [r0, r1]
    # mp.spawn's ranks carry no launcher's variable: the hooks' records name their rank
    parent, s0, s1 = (
        rank_member(20, None, "S"),
        rank_member(21, None, "S", 20),
        rank_member(22, None, "S", 20),
    )
    assert rank_processes([parent, s1, s0], {22: 1, 21: 0}) == [s0, s1]


def test_the_watch_keeps_where_each_rank_was(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    syscall(root, 11, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")  # rank 0 waits in a futex
    syscall(root, 12, "230 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x7ffd 0x7f\n")  # rank 1 sleeps
    watch = RankWatch(ProcFS(root), machine="x86_64", dumps=False)
    r0, r1 = rank_member(11, 0, "S"), rank_member(12, 1, "S")
    for t in range(10):
        r1.snapshot = r1.snapshot._replace(state="R" if t % 5 == 0 else "S")  # type: ignore[union-attr]
        watch.tick(float(t), [r0, r1], RankHints(steps={11: 100 + 3 * t}, rank_steps={1: 100 + 3 * t}))
    (v0, v1) = watch.views({}, {}, 10.0)
    assert (v0.rank, v0.pid, v0.looks, v0.where, v0.halves) == (0, 11, 10, "collective", (1.0, 1.0))
    assert v0.shares == (("collective", 1.0),)
    assert v1.shares == (("idle", 0.8), ("computing", 0.2)) and v1.idle_detail == "clock_nanosleep"
    assert v0.step == 127 and v0.rate == 3.0
    rows = watch.rows("gpu-07")
    assert rows[1] == {
        "rank": 1,
        "local_rank": 1,
        "node": "gpu-07",
        "group_rank": 0,
        "pid": 12,
        "step": 127,
        "rate": 3.0,
        "where": "idle",
        "where_detail": "clock_nanosleep",
        "shares": {"idle": 0.8, "computing": 0.2},
        "gpu": None,  # no GPU read (test_straggler_gpu.py)
        "collective": None,  # no flight recorder polled (test_rank_arrivals.py)
    }
    # the window slides: looks older than WINDOW_S go; a rank that exited is forgotten
    for t in range(10, 10 + int(WINDOW_S) + 2):
        watch.tick(float(t), [r0])
    (only,) = watch.views({}, {}, WINDOW_S)
    assert only.rank == 0 and only.looks <= WINDOW_S + 1


def test_a_ranks_looks_count_from_its_first_step(tmp_path: Path) -> None:
    """Rank 0 imports torch (running) for 8 s while rank 1 waits for it in the rendezvous (a futex); then
    both step. The start-up is no part of where their time goes."""
    root = tmp_path / "proc"
    syscall(root, 12, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")
    syscall(root, 11, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")
    watch = RankWatch(ProcFS(root), machine="x86_64", dumps=False)
    r0, r1 = rank_member(11, 0, "R"), rank_member(12, 1, "S")
    for t in range(8):
        watch.tick(float(t), [r0, r1])
    assert [v.looks for v in watch.views({}, {}, 8.0)] == [8, 8]  # no steps shown yet: every look
    r0.snapshot = r0.snapshot._replace(state="S")  # type: ignore[union-attr]
    for t in range(8, 14):
        watch.tick(float(t), [r0, r1], RankHints(steps={11: t, 12: t}))
    v0, v1 = watch.views({}, {}, 14.0)
    assert (v0.looks, v1.looks) == (6, 6) and v0.shares == (("collective", 1.0),)
    # a new bar (an epoch's) starts no start-up again
    watch.tick(14.0, [r0, r1], RankHints(steps={11: 0, 12: 0}))
    assert [v.looks for v in watch.views({}, {}, 15.0)] == [7, 7]


def test_each_ranks_major_faults_over_the_window(tmp_path: Path) -> None:
    """From the speed watch's reads at the window's ends (schedstat's run, wait, switches; majflt)."""
    root = tmp_path / "proc"
    syscall(root, 11, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")
    watch = RankWatch(ProcFS(root), machine="x86_64", dumps=False)
    r0 = rank_member(11, 0, "S")
    watch.tick(0.0, [r0])
    (v,) = watch.views({r0.ident: (0, 0, 5, 100)}, {r0.ident: (4 * 10**9, 10**9, 9, 600)}, 10.0)
    assert (v.majflt_per_s, v.cpu_used, v.wait_share) == (50.0, 0.4, 0.2)
    assert watch.views({}, {}, 0.0)[0].majflt_per_s == 0.0
    # born within the window: the faults of its start (its imports) are not counted
    assert watch.views({}, {r0.ident: (4 * 10**9, 10**9, 9, 600)}, 10.0)[0].majflt_per_s == 0.0


def test_a_stack_sample_says_what_a_blocked_call_is(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    syscall(root, 11, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")
    syscall(root, 12, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")
    watch = RankWatch(ProcFS(root), machine="x86_64", dumps=False)
    r0, r1 = rank_member(11, 0, "S"), rank_member(12, 1, "S")
    worker = rank_member(13, 1, "S", ppid=12, comm="pt_data_worker")
    watch.tick(0.0, [r0, r1, worker])
    assert [v.where for v in watch.views({}, {}, 1.0)] == ["collective", "unknown"]  # rank 1 has a loader
    c10d = "/x/torch/distributed/distributed_c10d.py"
    watch.learn(r0.ident, "futex", StackSample(0.0, (("all_reduce", c10d), ("main", "/job/train.py"))))
    loader = "/x/torch/utils/data/dataloader.py"
    watch.learn(r1.ident, "futex", StackSample(0.0, (("_next_data", loader), ("main", "/job/train.py"))))
    watch.tick(1.0, [r0, r1, worker])
    v0, v1 = watch.views({}, {}, 1.0)
    assert (v0.where, v0.where_detail) == ("collective", "all_reduce, futex wait")
    assert (v1.where, v1.where_detail, v1.data_detail) == (
        "data",
        "_next_data, futex wait",
        "_next_data, futex wait",
    )
    # a sleep: the job's own frame it sleeps in
    syscall(root, 12, "230 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x7ffd 0x7f\n")
    watch.learn(r1.ident, "clock_nanosleep", StackSample(0.0, (("main", "/job/train.py"),), (52,)))
    watch.tick(2.0, [r0, r1, worker])
    assert watch.views({}, {}, 1.0)[1].where_detail == "clock_nanosleep in main (train.py:52)"


# --- the frontends' rows ------------------------------------------------------------------------------

ROWS = [
    {"rank": 0, "pid": 11, "step": 120, "rate": 3.0, "where": "collective", "where_detail": "futex wait"},
    {"rank": 1, "pid": 12, "step": None, "rate": None, "where": "idle", "where_detail": ""},
]


def test_status_shows_a_table_of_the_ranks() -> None:
    from jobwarden.text.render import _rank_table

    assert list(_rank_table([])) == []
    assert list(_rank_table(ROWS)) == [
        "",
        "  RANK      PID     STEP      RATE  WHERE",
        "     0       11      120    3.00/s  collective (futex wait)",
        "     1       12        -         -  idle",
    ]
    # where a rank's flight recorder named its newest collective: a column of them (a rank behind in a hang)
    called = {"group": "0", "seq": 1205, "op": "all_reduce", "at": 1.0, "rate": 31.2}
    assert list(_rank_table([{**ROWS[0], "collective": called}, ROWS[1]]))[1:] == [
        "  RANK      PID     STEP      RATE  COLLECTIVE              WHERE",
        "     0       11      120    3.00/s  #1205 all_reduce        collective (futex wait)",
        "     1       12        -         -  -                       idle",
    ]


def test_top_shows_a_line_a_rank() -> None:
    from jobwarden.tui.cells import _ranks_text

    assert _ranks_text(ROWS, 100).plain.splitlines() == [
        "  rank 0  pid 11  step 120  3.00/s  collective (futex wait)",
        "  rank 1  pid 12  step -  -  idle",
    ]
    called = {"group": "0", "seq": 1205, "op": "all_reduce", "at": 1.0, "rate": 31.2}
    assert _ranks_text([{**ROWS[0], "collective": called}], 100).plain.splitlines() == [
        "  rank 0  pid 11  step 120  3.00/s  #1205 all_reduce  collective (futex wait)"
    ]


def test_each_ranks_step_from_its_prefixed_output() -> None:
    from jobwarden.progress.output import OutputProgress

    output = OutputProgress()
    output.feed("[rank0]:step 10/100\n[rank1]:step 7/100\n", True)
    output.feed(
        "[rank0]: 12%|#   | 12/100 [00:01<00:10, 9.0it/s]\r[rank1]:  9%|#   | 9/100 [00:01<00:10, 9.0it/s]\r",
        True,
    )
    assert output.steps_by_rank() == {0: 12, 1: 9}


def test_others_always_waiting_is_no_measure_of_how_much_slower() -> None:
    f = straggler(ranks(rank(0, 1.0), rank(1, 0.0)))
    assert f is not None and f.title == "Rank 1 is a straggler: more than 20× slower per step than the others"
    assert "its step takes more than 20× theirs" in f.summary
    f = straggler(ranks(rank(0, 0.9), rank(1, 0.0)))
    assert f is not None and f.title.startswith("Rank 1 is a straggler: about 10× slower")

"""The shim's speed watch over a /proc of files (the OS seam) and a real store: the counters it sums into
evidence, what it does not read again, and a finding's life — recorded once, resolved after two silent
judgements, with the moment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.model import Finding, JobSpec, JobState, ProcessId, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.record.findings import REFRESH_EVERY_S, LiveFindings
from jobwarden.shim.tree.jobtree import Member
from jobwarden.shim.watch.speedwatch import JUDGE_EVERY_S, READ_EVERY_S, SpeedWatch
from jobwarden.store import Store

T0 = 1_700_000_000.0


def stat_line(pid: int, state: str = "S", majflt: int = 0) -> bytes:
    fields = ["0"] * 50
    fields[0], fields[1], fields[9], fields[17], fields[19], fields[36] = (
        state,
        "1",
        str(majflt),
        "1",
        "500",
        "0",
    )
    return f"{pid} (python) {' '.join(fields)}\n".encode()


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        (root / "pressure").mkdir()
        for name in ("io", "memory"):
            self.pressure(name, 0)

    def pressure(self, name: str, total_us: int) -> None:
        (self.root / "pressure" / name).write_text(
            f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total_us}\n"
            f"full avg10=0.00 avg60=0.00 avg300=0.00 total={total_us // 2}\n"
        )

    def process(self, pid: int, exec_ns: int, delay_ns: int) -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        (self.root / str(pid) / "schedstat").write_text(f"{exec_ns} {delay_ns} 10\n")


def member(pid: int, state: str, majflt: int = 0) -> Member:
    m = Member(ProcessId(pid, 500), -1, 1, "python train.py")
    m.raw_stat = stat_line(pid, state, majflt)
    m.snapshot = ProcessSnapshot(pid, 1, 500, state, "python train.py", 1 << 20, 0.0)
    return m


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Store, int, int]]:
    with Store(tmp_path / "home") as s:
        spec = JobSpec(command=("python", "train.py"), cwd="/tmp", name="train.py", env={})
        job_id, run = s.create_job(spec, {}, T0)
        s.update_run(job_id, run, state=JobState.RUNNING, started_at=T0)
        yield s, job_id, run


def watch_for(store: tuple[Store, int, int], proc: FakeProc) -> SpeedWatch:
    s, job_id, run = store

    def write(method: object, *args: object) -> bool:
        method(job_id, run, *args)  # type: ignore[operator]
        return True

    watch = SpeedWatch(ProcFS(proc.root), LiveFindings(s, write), shim_pid=1)
    watch.main_pid = 1000
    return watch


def test_the_window_sums_each_process_delta_and_an_asleep_one_is_not_read_again(
    tmp_path: Path, store: tuple[Store, int, int]
) -> None:
    proc = FakeProc(tmp_path / "proc")
    busy, asleep = member(1000, "R", majflt=7), member(1001, "S")
    proc.process(1000, 0, 0)
    proc.process(1001, 5_000_000_000, 1_000_000_000)
    watch = watch_for(store, proc)
    t = 0.0
    while t <= 10.0:
        proc.process(1000, int(t * 0.5e9), int(t * 0.5e9))  # half of its runnable time waiting
        if t >= 4:
            (proc.root / "1001" / "schedstat").unlink(missing_ok=True)  # asleep: never read again
        busy.raw_stat = stat_line(1000, "R", majflt=7 + int(t))  # the tree read a new stat line
        watch.tick(T0 + t, t, [busy, asleep], [], None)
        t += READ_EVERY_S
    ev = watch.evidence(t, [busy, asleep])
    assert ev.window_s == pytest.approx(10.0)
    assert (ev.cpu_s, ev.run_delay_s) == pytest.approx((5.0, 5.0))  # the sleeper's counters did not move
    assert ev.wait_share == pytest.approx(0.5)
    assert ev.majflt == 10 and ev.processes == 2 and ev.threads == 2
    assert ev.memory_some_s == 0.0 and ev.pressure_scope == "machine"


def test_a_slowdown_is_recorded_once_and_resolved_when_the_rate_comes_back(
    tmp_path: Path, store: tuple[Store, int, int]
) -> None:
    s, job_id, run = store
    proc = FakeProc(tmp_path / "proc")
    proc.process(1000, 0, 0)
    main = member(1000, "S")
    watch = watch_for(store, proc)
    recorded, resolved = [], []
    step, t = 0.0, 0.0
    for seconds, rate in ((40, 10.0), (40, 10 / 3), (40, 10.0)):
        end = t + seconds
        while t < end:
            new, gone = watch.tick(T0 + t, t, [main], [], int(step))
            recorded += [(t, f) for f in new]
            resolved += [(t, f) for f in gone]
            t += 1.0
            step += rate
    assert [f.rule for _, f in recorded] == ["slowed-down"]
    at, slowed = recorded[0]
    assert 40 + 15 <= at <= 40 + 30  # after more than a blip, well within the goal of 30 s
    assert slowed.title.startswith(("slowed down 3.0× since step 400 (", "slowed down 3.1× since step 400 ("))
    ((gone_at, gone),) = resolved
    assert gone.rule == "slowed-down" and gone.resolved_at == T0 + gone_at
    assert 80 < gone_at <= 80 + 5 + 2 * JUDGE_EVERY_S + 6  # a stretch, then two silent judgements
    (stored,) = [f for _, f in s.findings(job_id, run)]
    assert stored.rule == "slowed-down" and stored.resolved_at == T0 + gone_at


@pytest.mark.parametrize(("home", "named"), [("/home/me/jw", 7), ("/srv/other-home", None), (None, None)])
def test_a_neighbours_job_is_named_only_when_it_is_of_this_home(
    tmp_path: Path,
    store: tuple[Store, int, int],
    monkeypatch: pytest.MonkeyPatch,
    home: str | None,
    named: int | None,
) -> None:
    monkeypatch.setenv("JOBWARDEN_HOME", "/home/me/jw")
    proc = FakeProc(tmp_path / "proc")
    proc.process(4242, 0, 0)
    env = [b"PATH=/usr/bin", b"JOBWARDEN_JOB_ID=7", b"SECRET=hunter2"]
    if home is not None:
        env.append(b"JOBWARDEN_HOME=" + home.encode())
    (proc.root / "4242" / "environ").write_bytes(b"\0".join(env) + b"\0")
    (proc.root / "4242" / "cmdline").write_bytes(b"python\0other.py\0")
    s, _, _ = store
    watch = SpeedWatch(ProcFS(proc.root), LiveFindings(s, lambda method, *a: method(*a)), shim_pid=1)
    neighbour = watch._describe(4242, 0.9)
    assert neighbour.job_id == named and "hunter2" not in repr(neighbour)


def test_a_slowdown_that_deepens_is_kept_as_last_seen(tmp_path: Path, store: tuple[Store, int, int]) -> None:
    """3x slower, then 5x: the stored finding (its one row, its first moment) says what the rule says last
    (the rate since the change, 40 s at 3x and 60 s at 5x: 3.9x), not its first 3.0x."""
    s, job_id, run = store
    proc = FakeProc(tmp_path / "proc")
    proc.process(1000, 0, 0)
    main = member(1000, "S")
    watch = watch_for(store, proc)
    step, t = 0.0, 0.0
    for seconds, rate in ((40, 10.0), (40, 10 / 3), (60, 2.0)):
        end = t + seconds
        while t < end:
            watch.tick(T0 + t, t, [main], [], int(step))
            t += 1.0
            step += rate
    (stored,) = [f for _, f in s.findings(job_id, run)]
    assert stored.rule == "slowed-down" and stored.current
    last_seen = ("slowed down 3.9× since step 400 (", "slowed down 4.0× since step 400 (")
    assert stored.title.startswith(last_seen), stored.title
    assert 40 + 15 <= stored.at - T0 <= 40 + 30  # the moment it became true, not the last rewrite


def test_a_current_finding_is_rewritten_when_its_headline_moves_and_otherwise_rarely(
    store: tuple[Store, int, int],
) -> None:
    s, job_id, run = store
    live = LiveFindings(s, lambda method, *a: method(job_id, run, *a))
    first = Finding("cpu-throttled", "throttled 40% of the time", "s", "warning", ("throttled 40%",))
    first = first._replace(pids=(7,))
    live.record([first], T0)
    assert live.refresh([first._replace(evidence=("throttled 41%",))], T0 + 4) == []  # figures only: later
    (headline,) = live.refresh([first._replace(title="throttled 70% of the time", severity="error")], T0 + 8)
    later = live.refresh([headline._replace(evidence=("throttled 72%",))], T0 + 8 + REFRESH_EVERY_S)
    assert [f.evidence for f in later] == [("throttled 72%",)]
    (stored,) = [f for _, f in s.findings(job_id, run)]
    assert (stored.title, stored.severity, stored.evidence, stored.at) == (
        "throttled 70% of the time", "error", ("throttled 72%",), T0
    )  # fmt: skip
    live.resolve_rules(["cpu-throttled"], T0 + 100)  # resolved by its latest text
    (stored,) = [f for _, f in s.findings(job_id, run)]
    assert stored.resolved_at == T0 + 100 and stored.title == "throttled 70% of the time"
    assert live.refresh([first], T0 + 200) == []  # no longer current: not rewritten
    (stored,) = [f for _, f in s.findings(job_id, run)]
    assert stored.title == "throttled 70% of the time"


def test_the_sampler_is_told_of_a_stall_once_the_counter_stood_still_as_long_as_one(
    tmp_path: Path, store: tuple[Store, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBWARDEN_PY_SPY", str(tmp_path / "absent"))  # the tag only, no dump
    proc = FakeProc(tmp_path / "proc")
    proc.process(1000, 0, 0)
    main = member(1000, "S")
    watch = watch_for(store, proc)
    told = []
    for t in range(30):  # a move a second for 20 s, then the counter stands still
        step = 10 * min(t, 20)
        watch.tick(T0 + t, float(t), [main], [], step)
        told.append(watch._stalled(float(t)))
    # the usual gap is 1 s: a stall after max(4 x 1 s, 3 s), tagged with the last move's moment
    assert told[:24] == [None] * 24 and told[24:] == [20.0] * 6
    assert watch.evidence(30.0, [main]).stall_sampling is False  # no py-spy: the finding need not wait
    watch.tick(T0 + 30, 30.0, [main], [], 210)  # it moves again: no stall
    assert watch._stalled(30.5) is None


def test_under_a_wrapper_the_cuda_libraries_are_looked_for_in_the_loop_not_the_shell(
    tmp_path: Path, store: tuple[Store, int, int]
) -> None:
    """gpu-not-used says "no CUDA library mapped" of the job: of its loop's process (torch loaded, picked by
    the stack sampler), not of the `sh -c` above it that maps none."""
    from jobwarden.probes import fakenvml
    from jobwarden.probes.gpu import open_gpu_probe
    from jobwarden.rules.speed.evidence import SpeedEvidence
    from jobwarden.shim.watch.gpuwatch import GpuWatch

    proc = FakeProc(tmp_path / "proc")
    for pid, maps in (
        (1000, "/usr/bin/dash\n"),
        (1001, "/venv/torch/lib/libtorch_cuda.so\n/x/libtorch_cpu.so\n"),
    ):
        proc.process(pid, 0, 0)
        (proc.root / str(pid) / "maps").write_text(maps)
    state = tmp_path / "nvml.json"
    fakenvml.write_state(state, {"devices": [fakenvml.device(0)]})
    probe = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert probe is not None
    gpu = GpuWatch(probe)
    try:
        s, _, _ = store
        watch = SpeedWatch(
            ProcFS(proc.root), LiveFindings(s, lambda m, *a: True), gpus_claimed=(0,), shim_pid=1
        )
        watch.main_pid = 1000
        loop = member(1001, "R")
        gpu.sample(0.0, [1000, 1001])
        busy = [ProcessSnapshot(1001, 1000, 500, "R", "python train.py", 1 << 20, 95.0)]
        watch._note_gpu(0.0, busy, gpu)
        ev = SpeedEvidence(window_s=10.0, cpus=2.0, affinity_cpus=2)
        assert watch._with_gpu(ev, 90.0, gpu).cuda_mapped is False  # nothing picked yet: the shell's maps
        watch.stacks.loop = loop.ident
        assert watch._with_gpu(ev, 91.0, gpu).cuda_mapped is True
    finally:
        gpu.close()


SPAWNED = (
    "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle={})"
    " --multiprocessing-fork"
)


def test_workers_are_batched_by_when_they_started_not_when_the_tree_first_saw_them(
    tmp_path: Path, store: tuple[Store, int, int]
) -> None:
    watch = watch_for(store, FakeProc(tmp_path / "proc"))
    hz = watch.procfs.ticks_per_s
    parent = Member(ProcessId(1000, 0), -1, 1, "python train.py")

    def worker(pid: int, started_s: float) -> Member:
        return Member(ProcessId(pid, round(started_s * hz)), -1, 1000, SPAWNED.format(pid))

    first, late = worker(2001, 100.0), worker(2002, 100.02)
    watch._note_workers(10.0, [parent, first])
    watch._note_workers(14.0, [parent, first, late])  # its sibling, seen 4 s late on a loaded machine
    watch._note_workers(15.0, [parent])  # the epoch ended
    nxt = [worker(2003, 105.0), worker(2004, 105.01)]
    watch._note_workers(16.0, [parent, *nxt])
    batches = [b for _, b in watch._batches]
    assert [(b.count, b.ended_at) for b in batches] == [(2, 15.0), (2, None)]


def test_a_job_given_a_gpu_it_never_uses_is_told_within_45s_of_computing_on_the_cpu(
    tmp_path: Path, store: tuple[Store, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shim's watches as the supervisor drives them, on a fake clock and fake NVML: a job given GPU 0
    that computes on the CPU (no CUDA library mapped, no GPU memory held) from its start."""
    from jobwarden.probes import fakenvml
    from jobwarden.probes.gpu import open_gpu_probe
    from jobwarden.shim.watch.gpuwatch import GpuWatch

    monkeypatch.setenv("JOBWARDEN_PY_SPY", str(tmp_path / "absent"))
    proc = FakeProc(tmp_path / "proc")
    (proc.root / "1000").mkdir()
    (proc.root / "1000" / "maps").write_text("7f00 r-xp /venv/torch/lib/libtorch_cpu.so\n")
    state = tmp_path / "nvml.json"
    fakenvml.write_state(state, {"devices": [fakenvml.device(0)]})
    probe = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert probe is not None
    gpu = GpuWatch(probe)
    s, _, _ = store
    watch = SpeedWatch(ProcFS(proc.root), LiveFindings(s, lambda m, *a: True), gpus_claimed=(0,), shim_pid=1)
    watch.main_pid = 1000
    main = member(1000, "R")
    busy = [ProcessSnapshot(1000, 1, 500, "R", "python train.py", 1 << 20, 99.0)]
    told = None
    try:
        for t in range(120):  # a tick a second, as the supervisor's while the job works
            proc.process(1000, int(t * 0.99e9), 0)
            main.raw_stat = stat_line(1000, "R", majflt=t)
            gpu.sample(float(t), [1000])
            new, _ = watch.tick(T0 + t, float(t), [main], busy, None, gpu=gpu)
            if any(f.rule == "gpu-not-used" for f in new):
                told = t
                break
    finally:
        gpu.close()
    print(f"gpu-not-used: told {told}s after the job began computing on the CPU")
    assert told is not None and told <= 45

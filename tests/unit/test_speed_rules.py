"""The speed rules on recorded evidence (rules.speed): each fires on its cause with the share it costs, and
stays silent where it must — a healthy compute-bound job, a steady bar, a blip, a quota that never bites,
neighbours that take nothing — plus the counters' parsers (property tests: outside input) and the shim's
stretches of the step counter."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.model import Finding
from jobwarden.osapi.cpuquota import CpuStat, parse_cpu_stat, parse_quota
from jobwarden.osapi.procfs import Pressure, parse_pressure, parse_schedstat, parse_stat, parse_stat_counters
from jobwarden.probes import fakenvml
from jobwarden.probes.gpu import open_gpu_probe
from jobwarden.rules.speed import JUDGED, SPEED_RULES, judge
from jobwarden.rules.speed.evidence import GpuClock, GpuShare, Neighbour, Segment, SpeedEvidence, StepMove
from jobwarden.rules.speed.gpu import UNUSED_AFTER_S
from jobwarden.rules.speed.steps import slowdown
from jobwarden.shim.watch.speedwatch import Segments, claimed_gpus

from .test_rules import assert_well_formed

T0 = 1_700_000_000.0

# a compute-bound job alone on its 2 CPUs: busy, hardly waiting, nothing throttled
HEALTHY = SpeedEvidence(
    window_s=20.0,
    cpus=2.0,
    affinity_cpus=2,
    cpu_s=38.0,
    run_delay_s=1.5,
    timeslices=4000,
    throttled_s=0.0,
    periods=200,
    throttled_periods=0,
    quota_cpus=None,
    processes=3,
    threads=9,
    runnable_threads=2.0,
    dstate_share=0.0,
    majflt=3,
    io_some_s=0.1,
    memory_some_s=0.0,
    memory_full_s=0.0,
    main_pid=100,
    pids=(100, 101, 102),
)


def steady(rate: float, n: int, start_step: int = 0, seconds: float = 5.0) -> list[Segment]:
    return [
        Segment(at=T0 + i * seconds, step=start_step + int(i * rate * seconds), rate=rate, seconds=seconds)
        for i in range(n)
    ]


def with_segments(*parts: list[Segment]) -> SpeedEvidence:
    segments: list[Segment] = []
    for part in parts:
        for s in part:
            at = segments[-1].at + segments[-1].seconds if segments else T0
            step = segments[-1].step + int(segments[-1].rate * segments[-1].seconds) if segments else 0
            segments.append(replace(s, at=at, step=step))
    return replace(HEALTHY, segments=tuple(segments))


def rules(found: list[Finding]) -> list[str]:
    return [f.rule for f in found]


def one(ev: SpeedEvidence, rule: str) -> Finding:
    found = judge(ev)
    assert_well_formed(found)
    assert rule in rules(found), rules(found)
    finding = next(f for f in found if f.rule == rule)
    assert finding.pids == (
        100,
    )  # the main process: a finding's key stays the same judgement after judgement
    assert finding.remedy and finding.evidence
    return finding


def test_judged_rules_are_design_rules() -> None:
    assert set(JUDGED) <= SPEED_RULES


# --- must not fire ------------------------------------------------------------------------------------


def test_a_healthy_compute_bound_job_has_no_speed_finding() -> None:
    assert judge(HEALTHY) == []


def test_a_steady_bar_is_not_slowed_down() -> None:
    assert judge(with_segments(steady(10.0, 40))) == []


def test_a_noisy_but_steady_bar_is_not_slowed_down() -> None:
    rates = [10.0, 8.0, 11.0, 9.5, 7.0, 10.5, 9.0, 8.5, 10.0, 9.0] * 4
    assert judge(with_segments([Segment(T0, 0, r, 5.0) for r in rates])) == []


def test_a_pause_for_a_checkpoint_is_a_blip_not_a_slowdown() -> None:
    ev = with_segments(steady(10.0, 10), [Segment(T0, 0, 1.0, 8.0)], steady(10.0, 5))
    assert judge(ev) == []


def test_a_slow_warm_up_sets_no_baseline() -> None:
    # compiling and filling caches: slow first, then steady; the steady rate is not a slowdown of warm-up
    assert judge(with_segments(steady(2.0, 3), steady(10.0, 20))) == []


def test_a_quota_that_never_bites_is_not_throttling() -> None:
    ev = replace(HEALTHY, quota_cpus=4.0, cpus=2.0, throttled_s=0.01, throttled_periods=2, periods=200)
    assert judge(ev) == []


def test_waiting_with_nobody_named_and_no_own_threads_is_no_contention() -> None:
    # the run queue says it waited, but nothing outside used its CPUs (a scan not taken yet): no guess
    ev = replace(HEALTHY, run_delay_s=30.0, neighbours=(), runnable_threads=1.0)
    assert judge(ev) == []


def test_neighbours_that_hardly_run_are_not_named() -> None:
    small = Neighbour(pid=7, user="bob", cpu=0.05, cmdline="sshd")
    ev = replace(HEALTHY, run_delay_s=30.0, neighbours=(small,), runnable_threads=1.0)
    assert judge(ev) == []


def test_a_busy_disk_of_someone_else_is_not_the_jobs_io() -> None:
    # the machine's I/O pressure is high, but no process of the job waits on storage
    assert judge(replace(HEALTHY, io_some_s=15.0, dstate_share=0.0)) == []


def test_memory_pressure_without_faults_of_the_job_is_not_its_thrash() -> None:
    assert judge(replace(HEALTHY, memory_some_s=5.0, majflt=10)) == []


def test_a_gpu_job_that_holds_memory_is_using_its_gpu() -> None:
    ev = replace(HEALTHY, gpus_claimed=(0,), gpu_bytes=4 << 30, gpu_unused_s=0.0)
    assert judge(ev) == []


def test_a_gpu_job_still_loading_is_not_yet_gpu_not_used() -> None:
    ev = replace(HEALTHY, gpus_claimed=(0,), gpu_bytes=0, gpu_unused_s=UNUSED_AFTER_S - 4, cuda_mapped=False)
    assert judge(ev) == []


# --- fires --------------------------------------------------------------------------------------------


def test_slowed_down_names_the_factor_the_step_and_the_moment() -> None:
    ev = with_segments(steady(10.0, 12), steady(10 / 3, 4))
    f = one(ev, "slowed-down")
    first_slow = ev.segments[12]
    assert f.title.startswith(f"slowed down 3.0× since step {first_slow.step} (")
    assert f.severity == "warning" and "67%" in f.summary
    assert judge(with_segments(steady(10.0, 12), steady(10 / 3, 2))) == []  # 10 s of it: still a blip


def test_a_standstill_is_no_slowdown() -> None:
    # a counter that stopped is `stalled` (progress watch) and then hung: not "slowed down"
    assert judge(with_segments(steady(10.0, 6), [Segment(T0, 0, 0.0, 60.0)] * 2)) == []
    assert rules(judge(with_segments(steady(10.0, 6), [Segment(T0, 0, 0.5, 60.0)] * 2))) == ["slowed-down"]


def test_slowdown_measures_from_the_first_slow_stretch() -> None:
    segments = steady(10.0, 6) + steady(4.0, 3)
    found = slowdown([replace(s, at=T0 + i) for i, s in enumerate(segments)])
    assert found is not None
    base, first, rate, seconds = found
    assert base == 10.0 and first.at == T0 + 6 and rate == 4.0 and seconds == 15.0


def test_cpu_throttled_says_the_quota_and_the_share() -> None:
    ev = replace(
        HEALTHY,
        quota_cpus=0.25,
        cpus=0.25,
        cpu_s=5.0,
        run_delay_s=15.0,
        throttled_s=14.0,
        periods=200,
        throttled_periods=180,
    )
    f = one(ev, "cpu-throttled")
    assert "0.25 CPUs" in f.title and "90%" in f.title and f.severity == "warning"
    assert "OMP_NUM_THREADS=1" in f.remedy
    assert rules(judge(ev)) == ["cpu-throttled"]  # one CPU cause: the quota, not contention as well


def test_cpu_contention_names_the_neighbour_its_user_and_job() -> None:
    hog = Neighbour(pid=4242, user="alice", cpu=0.9, cmdline="python train.py", job_id=17)
    other = Neighbour(pid=99, user="bob", cpu=0.3, cmdline="make -j")
    ev = replace(HEALTHY, cpu_s=10.0, run_delay_s=10.0, runnable_threads=1.0, neighbours=(other, hog))
    f = one(ev, "cpu-contention")
    assert "pid 4242 (alice, job 17) and 1 more" in f.title and "50%" in f.title
    assert f.evidence[0].startswith("pid 4242 (alice, jobwarden job 17) used 0.90 CPUs")


@pytest.mark.parametrize(
    ("cpu_s", "run_delay_s", "why"),
    [
        (0.4, 1.2, "a loop that sleeps most of its step: 0.08 of a CPU wanted, 75% of it waited"),
        (0.01, 0.04, "deadlocked: 0.0s on a CPU, 0.0s runnable but waiting, and 80% of that"),
    ],
)
def test_a_wait_on_a_tiny_demand_is_no_contention(cpu_s: float, run_delay_s: float, why: str) -> None:
    hog = Neighbour(pid=4242, user="alice", cpu=1.9, cmdline="python train.py", job_id=17)
    ev = replace(HEALTHY, cpu_s=cpu_s, run_delay_s=run_delay_s, runnable_threads=4.0, neighbours=(hog,))
    assert ev.wait_share >= 0.25, why
    assert rules(judge(ev)) == [], why


def test_cpu_oversubscribed_when_its_own_threads_fill_its_cpus() -> None:
    hog = Neighbour(pid=4242, user="alice", cpu=0.3, cmdline="x")
    ev = replace(HEALTHY, cpu_s=39.0, run_delay_s=80.0, runnable_threads=8.0, neighbours=(hog,), processes=4)
    f = one(ev, "cpu-oversubscribed")
    assert "8 busy threads on 2 CPUs" in f.title and "OMP_NUM_THREADS" in f.remedy
    assert "cpu-contention" not in rules(judge(ev))
    # the same threads, but the job gets little of its CPUs: someone else has them
    assert "cpu-oversubscribed" not in rules(judge(replace(ev, cpu_s=8.0)))


def test_io_bound_on_d_state_and_pressure() -> None:
    f = one(replace(HEALTHY, dstate_share=0.6, io_some_s=12.0), "io-bound")
    assert "60%" in f.title and f.severity == "warning"
    assert judge(replace(HEALTHY, dstate_share=0.6, io_some_s=0.5)) == []  # D, but no I/O pressure: short


def test_memory_thrash_on_pressure_and_faults() -> None:
    f = one(replace(HEALTHY, memory_some_s=4.0, memory_full_s=2.0, majflt=5000), "memory-thrash")
    assert f.severity == "info" and "20%" in f.title  # a fifth of the time: worth saying, not a warning


def test_page_cache_thrash_shows_as_refaults_and_is_the_cause_of_the_io_wait() -> None:
    # research 5.7: a memcg limit below the working set re-reads the file each pass; memory pressure
    # stays tiny and major faults too (readahead), the refaults and the I/O wait do not
    ev = replace(HEALTHY, refault_pages=40_000, dstate_share=0.5, io_some_s=8.0, memory_some_s=0.05)
    f = one(ev, "memory-thrash")
    assert f.title == "re-reads evicted memory: stalled 40% of the time" and f.severity == "warning"
    assert f.evidence[0].startswith("40000 pages read back after eviction")
    assert rules(judge(ev)) == ["memory-thrash"]  # not io-bound as well: the wait is for evicted pages
    assert rules(judge(replace(ev, refault_pages=5_000))) == ["io-bound"]  # a few refaults: just slow I/O


def test_refaults_that_cost_no_time_are_no_memory_thrash() -> None:
    # seen on a DataLoader job starting after a big test run had evicted the machine's page cache: 17216
    # pages read back in 8 s (its workers importing torch again), no stall on memory, no wait on storage
    ev = replace(HEALTHY, window_s=8.0, refault_pages=17_216, majflt=58, memory_some_s=0.0, io_some_s=0.0)
    assert judge(ev) == []


def test_gpu_not_used_after_a_minute_on_the_cpu() -> None:
    ev = replace(HEALTHY, gpus_claimed=(0, 1), gpu_bytes=0, gpu_unused_s=90.0, cuda_mapped=False)
    f = one(ev, "gpu-not-used")
    assert "GPU 0, 1" in f.title and any("no CUDA library" in e for e in f.evidence)
    assert judge(replace(ev, cuda_mapped=True)) == []  # CUDA loaded: busy on the CPU first, maybe


def test_gpu_shared_names_the_other_process() -> None:
    ev = replace(HEALTHY, gpu_sharers=(GpuShare(0, 555, 2 << 30, "carol", None, "python other.py"),))
    f = one(ev, "gpu-shared")
    assert f.title == "GPU 0 shared with pid 555 (carol)"


# --- the step counter's stretches ---------------------------------------------------------------------


def test_segments_need_time_and_steps_and_restart_on_a_new_bar() -> None:
    seg = Segments()
    for t in range(0, 12):
        seg.observe(float(t), T0 + t, t * 10)
    assert [(s.step, s.rate) for s in seg.done] == [(0, 10.0), (50, 10.0)]
    seg.observe(12.0, T0 + 12, 3)  # a new epoch's bar
    seg.observe(18.0, T0 + 18, 4)  # 6 s but one step: not a stretch yet
    assert len(seg.done) == 2
    seg.observe(80.0, T0 + 80, 4)  # past a minute: closed, however few steps it holds
    assert seg.done[-1] == Segment(at=T0 + 12, step=3, rate=1 / 68, seconds=68.0)


def test_claimed_gpus() -> None:
    assert claimed_gpus({"CUDA_VISIBLE_DEVICES": "0,2"}) == (0, 2)
    assert claimed_gpus({"CUDA_VISIBLE_DEVICES": "GPU-abc,²"}) == ()
    assert claimed_gpus({}) == ()


# --- parsers of outside input -------------------------------------------------------------------------


def test_parsers_on_real_files() -> None:
    assert parse_schedstat("109292 46900 1\n") == (109292, 46900, 1)
    assert parse_pressure(
        "some avg10=95.96 avg60=64.54 avg300=22.09 total=5641003837\nfull avg10=0.00 avg60=0.00 "
        "avg300=0.00 total=0\n"
    ) == Pressure(5641003837, 0)
    v1 = "nr_periods 91\nnr_throttled 90\nthrottled_time 5440000000\nnr_bursts 0\nburst_time 0\n"
    assert parse_cpu_stat(v1) == CpuStat(91, 90, 5_440_000_000)
    v2 = "usage_usec 10\nuser_usec 5\nsystem_usec 5\nnr_periods 4\nnr_throttled 2\nthrottled_usec 300\n"
    assert parse_cpu_stat(v2) == CpuStat(4, 2, 300_000)
    assert parse_cpu_stat("usage_usec 10\nuser_usec 5\nsystem_usec 5\n") is None  # no cpu controller
    assert parse_quota(1, "25000\n", "100000\n") == 0.25
    assert parse_quota(1, "-1\n", "100000\n") is None
    assert parse_quota(2, "150000 100000\n") == 1.5
    assert parse_quota(2, "max 100000\n") is None
    assert parse_quota(2, "5 0") is None and parse_quota(2, "-1 100000") is None  # found by hypothesis
    line = Path("/proc/self/stat").read_text()
    counters = parse_stat_counters(line)
    assert counters.num_threads >= 1 and counters.majflt >= 0
    assert parse_stat(line).processor == counters.processor >= 0


TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=200) | st.builds(
    lambda kinds, values: "\n".join(f"{k} {v}" for k, v in zip(kinds, values, strict=False)),
    st.lists(st.sampled_from(["nr_periods", "nr_throttled", "throttled_time", "throttled_usec", "x"])),
    st.lists(st.sampled_from(["0", "12", "-1", "²", "1e3", "9" * 30, ""])),
)


@given(TEXT)
def test_cpu_stat_answers_or_says_none(text: str) -> None:
    stat = parse_cpu_stat(text)
    assert stat is None or min(stat) >= 0


@given(TEXT, TEXT, st.sampled_from([1, 2]))
def test_quota_answers_a_positive_number_or_none(quota: str, period: str, version: int) -> None:
    cpus = parse_quota(version, quota, period)
    assert cpus is None or cpus > 0


@given(TEXT)
def test_pressure_answers_or_refuses_with_value_error(text: str) -> None:
    try:
        p = parse_pressure(text)
    except ValueError:
        return
    assert p.some_us >= 0


@given(TEXT)
def test_schedstat_answers_or_refuses_with_value_error(text: str) -> None:
    try:
        s = parse_schedstat(text)
    except ValueError:
        return
    assert len(s) == 3


# --- GPU clocks: fake NVML through the real probe, then the rule --------------------------------------

HW_THERMAL, GPU_IDLE_REASON, APP_CLOCKS = 0x40, 0x1, 0x2


def test_gpu_throttled_on_a_thermal_slowdown() -> None:
    clock = GpuClock(0, sm_mhz=990, sm_max_mhz=1980, reasons=HW_THERMAL, utilization=98.0)
    f = one(replace(HEALTHY, gpu_clocks=(clock,)), "gpu-throttled")
    assert f.title == "GPU 0 runs at 50% of its clock: hardware thermal slowdown"
    assert f.severity == "warning" and "0x40" in f.evidence[0]


@pytest.mark.parametrize(
    ("mhz", "reasons"),
    [
        (300, GPU_IDLE_REASON),  # an idle GPU lowers its clock: nothing to lose
        (1200, APP_CLOCKS),  # clocks someone chose: not a limit
        (1900, HW_THERMAL),  # within 10 % of the most: a wobble
        (1980, 0),
    ],
)
def test_gpu_clocks_that_are_no_throttling(mhz: int, reasons: int) -> None:
    clock = GpuClock(0, sm_mhz=mhz, sm_max_mhz=1980, reasons=reasons)
    assert judge(replace(HEALTHY, gpu_clocks=(clock,))) == []


def test_the_probe_reads_clocks_and_reasons_from_fake_nvml(tmp_path: Path) -> None:
    state = tmp_path / "nvml.json"
    hot = {**fakenvml.device(0), "clocks": {"sm": 990, "sm_max": 1980}, "clock_reasons": HW_THERMAL}
    fakenvml.write_state(state, {"devices": [hot, fakenvml.device(1)]})
    probe = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert probe is not None
    with probe:
        first, second = probe.devices()
    assert (first.sm_clock_mhz, first.sm_clock_max_mhz, first.clock_reasons) == (990, 1980, HW_THERMAL)
    assert (second.sm_clock_mhz, second.sm_clock_max_mhz, second.clock_reasons) == (None, None, None)
    nvml = fakenvml.FakeNvml(state)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fakenvml.NVMLError):  # per-process utilisation: not in this state file
        nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    fakenvml.update_state(state, lambda s: s["devices"][0].update(process_utilization=[{"pid": 7, "sm": 80}]))
    (sample,) = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert (sample.pid, sample.smUtil, sample.memUtil) == (7, 80, 0)


# --- periodic stalls from the counter's moves -----------------------------------------------------------


def moves_with_stalls(
    every: int, stall_s: float, n: int = 400, at_steps: frozenset[int] = frozenset()
) -> tuple[StepMove, ...]:
    """A counter seen once a second moving 10 steps a time, standing still `stall_s` every `every` steps
    (or at the steps `at_steps`)."""
    moves, at = [], 0.0
    for i in range(n):
        step = i * 10
        moves.append(StepMove(at, step))
        stall = step in at_steps if at_steps else step > 0 and step % every == 0
        at += stall_s if stall else 1.0
    return tuple(moves)


def test_a_checkpoint_every_500_steps_is_a_periodic_stall() -> None:
    f = one(replace(HEALTHY, moves=moves_with_stalls(500, 12.0)), "periodic-stall")
    assert f.title.startswith("progress stops for 12s every 500 steps: ") and f.title.endswith(
        "% of the time"
    )
    assert f.severity == "info"  # 7 of 400 moves: 15 % of the time


def test_stalls_that_are_short_rare_or_irregular_are_not_periodic() -> None:
    assert judge(replace(HEALTHY, moves=moves_with_stalls(500, 2.5))) == []  # a 2.5 s pause: noise
    assert judge(replace(HEALTHY, moves=moves_with_stalls(2000, 12.0))) == []  # one stall: not periodic
    irregular = frozenset({300, 1500, 1700, 2900, 3100, 3800})
    assert judge(replace(HEALTHY, moves=moves_with_stalls(0, 12.0, at_steps=irregular))) == []
    assert judge(replace(HEALTHY, moves=moves_with_stalls(100, 0.0, n=50))) == []  # steady
    stalled = moves_with_stalls(1000, 5.0)  # regular, but 5 s every 100 s: under a tenth of the time
    assert judge(replace(HEALTHY, moves=stalled)) == []

"""A straggler's GPU as its why (issue 26): each rank's own GPU, found through NVML's process list (the
fake NVML here) by the speed watch, named when its clock is held back by a limit the others' GPUs are
not; published in the rank views and checked there like every other field (rules.speed.acrossnodes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from jobwarden.observations import GpuProcess
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import fakenvml
from jobwarden.probes.gpu import open_gpu_probe
from jobwarden.rules.speed.acrossnodes import group_straggler, node_document, node_ranks
from jobwarden.rules.speed.evidence import GpuClock, RankView, SpeedEvidence
from jobwarden.rules.speed.ranks import straggler
from jobwarden.shim.record.findings import LiveFindings
from jobwarden.shim.watch.gpuwatch import GpuWatch
from jobwarden.shim.watch.rankwatch import RankWatch, ranks_on_gpus
from jobwarden.shim.watch.speedwatch import SpeedWatch
from jobwarden.store import Store

from .test_speed_ranks import rank, rank_member, ranks, syscall
from .test_speedwatch import FakeProc

HW_THERMAL = 0x40
SW_POWER_CAP = 0x4
GPU_IDLE = 0x1
WALL = 1_700_000_000.0


def computing(n: int, gpu: GpuClock | None = None) -> RankView:
    """A rank whose main thread computes (or drives its GPU) most of the time: the others wait for it."""
    shares = (("computing", 0.95), ("collective", 0.05))
    return RankView(rank=n, pid=200 + n, looks=20, shares=shares, gpu=gpu)


def cool(i: int) -> GpuClock:
    return GpuClock(i, 1980, 1980, 0, 97.0)


def hot(i: int, mhz: int = 1100, reasons: int = HW_THERMAL) -> GpuClock:
    return GpuClock(i, mhz, 1980, reasons, 99.0)


# --- the rule ---------------------------------------------------------------------------------------


def test_its_own_throttled_gpu_is_its_why() -> None:
    ev = ranks(rank(0, 0.6, gpu=cool(0)), computing(1, hot(1)), rank(2, 0.55, gpu=cool(2)))
    f = straggler(ev)
    assert f is not None and f.rank == 1
    why = (
        "its GPU 1 ran at 1.1 GHz of 1.98 GHz: hardware thermal slowdown (NVML clock event reasons 0x40), "
        "utilisation 99%; the others' at 1.98 GHz"
    )
    assert f"Why: {why}." in f.summary, f.summary
    assert why in f.evidence
    assert "cooling and power" in f.remedy and "nvidia-smi" in f.remedy


def test_a_gpu_every_rank_shares_the_slowness_of_is_not_its_why() -> None:
    """Every GPU as throttled (a hot machine room), an idle clock, or a clock lowered by no limit."""
    for slow, theirs in (
        (hot(1), hot(0, 1150)),
        (hot(1, reasons=HW_THERMAL | GPU_IDLE), cool(0)),
        (hot(1, reasons=0), cool(0)),
        (hot(1, mhz=1900), cool(0)),  # 96 % of its clock: no throttling worth naming
    ):
        f = straggler(ranks(rank(0, 0.6, gpu=theirs), computing(1, slow), rank(2, 0.6, gpu=theirs)))
        assert f is not None and f.rank == 1
        assert not any("its GPU" in e for e in f.evidence), (slow, f.evidence)
        assert "computed in 95%" in f.summary


def test_with_each_ranks_gpu_known_another_ranks_hot_gpu_is_not_the_stragglers_why() -> None:
    """The job-wide hint ("GPU 0 of the job runs at…") is for jobs whose ranks' GPUs are unknown: here
    the hot GPU is rank 0's, not the straggler's."""
    ev = replace(
        ranks(rank(0, 0.6, gpu=hot(0)), computing(1, cool(1)), rank(2, 0.6, gpu=cool(2))),
        gpu_clocks=(hot(0), cool(1), cool(2)),
    )
    f = straggler(ev)
    assert f is not None and f.rank == 1
    assert not any("GPU" in e for e in f.evidence), f.evidence


# --- each rank's GPU, through NVML's process list (fake NVML) ---------------------------------------


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[tuple[SpeedWatch, Path]]:
    with Store(tmp_path / "home") as s:
        found = SpeedWatch(ProcFS(FakeProc(tmp_path / "proc").root), LiveFindings(s, lambda m, *a: True))
        found.ranks = RankWatch(found.procfs, machine="x86_64", dumps=False)  # no py-spy on made-up pids
        yield found, tmp_path / "nvml.json"


def test_the_speed_watch_gives_each_rank_the_gpu_its_process_holds(watch: tuple[SpeedWatch, Path]) -> None:
    speed, state = watch
    gpus = [fakenvml.device(i, utilization=97) for i in range(3)]
    for i, gpu in enumerate(gpus):
        gpu["clocks"] = {"sm": 1980 if i != 2 else 1100, "sm_max": 1980}
        gpu["clock_reasons"] = HW_THERMAL if i == 2 else 0
    fakenvml.write_state(state, {"devices": gpus})
    # rank 1 (pid 201) computes on GPU 2, the hot one; rank 0 on GPU 0; GPU 1 is nobody's of these
    fakenvml.hold(state, 0, 200, 1 << 30)
    fakenvml.hold(state, 2, 201, 1 << 30)
    probe = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert probe is not None
    gpu = GpuWatch(probe)
    try:
        gpu.sample(0.0, [200, 201])
        ev = SpeedEvidence(window_s=20.0, cpus=2.0, affinity_cpus=2, ranks=(rank(0, 0.6), computing(1)))
        judged = speed._with_gpu(ev, 1.0, gpu)
    finally:
        gpu.close()
    first, second = judged.ranks
    assert first.gpu == GpuClock(0, 1980, 1980, 0, 97.0)
    assert second.gpu == GpuClock(2, 1100, 1980, HW_THERMAL, 97.0)
    f = straggler(judged)
    assert f is not None and f.rank == 1 and f.summary.count("its GPU 2 ran at 1.1 GHz of 1.98 GHz") == 1
    # the rank watch is told, for `status --json`'s rows of these ranks
    root = speed.procfs.root
    for pid in (200, 201):
        syscall(root, pid, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")
    speed.ranks.tick(2.0, [rank_member(200, 0, "S"), rank_member(201, 1, "S")])
    assert [r["gpu"]["index"] for r in speed.ranks.rows("n1")] == [0, 2]


def test_a_rank_with_no_gpu_of_its_own_gets_none(watch: tuple[SpeedWatch, Path]) -> None:
    speed, state = watch
    gpu0 = {**fakenvml.device(0), "clocks": {"sm": 900, "sm_max": 1980}, "clock_reasons": HW_THERMAL}
    fakenvml.write_state(state, {"devices": [gpu0]})
    fakenvml.hold(state, 0, 999, 1 << 30)  # a process of the job, not a rank
    probe = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(state)})
    assert probe is not None
    gpu = GpuWatch(probe)
    try:
        gpu.sample(0.0, [200, 201, 999])
        ev = SpeedEvidence(window_s=20.0, cpus=2.0, affinity_cpus=2, ranks=(rank(0, 0.6), computing(1)))
        judged = speed._with_gpu(ev, 1.0, gpu)
    finally:
        gpu.close()
    assert [r.gpu for r in judged.ranks] == [None, None]
    assert len(judged.gpu_clocks) == 1  # the job's GPU stays known: the job-wide hint
    f = straggler(judged)
    assert f is not None and any("GPU 0 of the job runs at 900 of 1980 MHz" in e for e in f.evidence)


def test_each_ranks_row_shows_its_gpu_until_it_holds_none(tmp_path: Path) -> None:
    """`status --json`'s ranks: the GPU each rank computes on, as the last judgement read it."""
    root = tmp_path / "proc"
    for pid in (200, 201):
        syscall(root, pid, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")
    watch = RankWatch(ProcFS(root), machine="x86_64", dumps=False)
    members = [rank_member(200, 0, "S"), rank_member(201, 1, "S")]
    watch.tick(0.0, members)
    held = [GpuProcess(0, 200, 1 << 30), GpuProcess(2, 201, 1 << 30)]
    watch.note_gpus(ranks_on_gpus(watch.views({}, {}, 0.0), (cool(0), hot(2)), held))
    rows = watch.rows("n1")
    assert [r["gpu"] for r in rows] == [
        {"index": 0, "sm_mhz": 1980, "sm_max_mhz": 1980, "utilization": 97.0, "limits": []},
        {
            "index": 2,
            "sm_mhz": 1100,
            "sm_max_mhz": 1980,
            "utilization": 99.0,
            "limits": ["hardware thermal slowdown"],
        },
    ]
    assert watch.views({}, {}, 0.0)[1].gpu == hot(2)  # the next window's view carries it too
    # rank 1 let go of its GPU: no longer shown as its
    watch.note_gpus(ranks_on_gpus(watch.views({}, {}, 0.0), (cool(0), hot(2)), held[:1]))
    assert [r["gpu"] is None for r in watch.rows("n1")] == [False, True]


# --- across nodes: published, checked, named with the node ------------------------------------------


def node(name: str, *views: RankView) -> dict:
    return json.loads(json.dumps(node_document(name, WALL, 20.0, views, ())))


def test_across_nodes_the_stragglers_gpu_on_its_node_is_its_why() -> None:
    docs = [node("n1", rank(0, 0.6, gpu=cool(0))), node("n2", computing(3, hot(0)))]
    found = [node_ranks(d) for d in docs]
    assert all(n is not None for n in found)
    s = group_straggler([n for n in found if n is not None])
    assert s is not None and (s.finding.rank, s.node, s.pid) == (3, "n2", 203)
    assert "Why: its GPU 0 ran at 1.1 GHz of 1.98 GHz: hardware thermal slowdown" in s.finding.summary
    assert docs[1]["ranks"][0]["gpu"] == {
        "gpu_index": 0,
        "sm_mhz": 1100,
        "sm_max_mhz": 1980,
        "reasons": HW_THERMAL,
        "utilization": 99.0,
    }


def test_a_rank_views_document_with_a_bad_gpu_is_refused_whole() -> None:
    good = node("n2", computing(3, hot(0)), rank(4, 0.6))
    assert node_ranks(good) is not None
    assert node_ranks(node("n2", computing(3))) is not None  # no GPU known: fine
    gpu = good["ranks"][0]["gpu"]
    for bad in (
        [1, 1100, 1980, 64, 99],
        "GPU 0",
        {**gpu, "gpu_index": "0"},
        {**gpu, "gpu_index": -1},
        {**gpu, "sm_mhz": 1.5},
        {**gpu, "sm_mhz": 10**9},
        {**gpu, "sm_max_mhz": None},
        {**gpu, "reasons": True},
        {**gpu, "utilization": 150},
        {**gpu, "utilization": "hot"},
        {k: v for k, v in gpu.items() if k != "sm_mhz"},
    ):
        doc = {**good, "ranks": [{**good["ranks"][0], "gpu": bad}, good["ranks"][1]]}
        assert node_ranks(doc) is None, bad

"""gpu-idle (in explain) and stray-gpu-process (machine-wide, stray_gpu_findings)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jobwarden.observations import GpuDevice, GpuProcess
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.gpu import GpuOwner, stray_gpu_findings

from .test_rules import assert_well_formed, rules_of

GiB = 1 << 30
H100 = GpuDevice(0, "GPU-5d1c", "NVIDIA H100 80GB HBM3", 80 * GiB, 31 * GiB, 0.0)
H100_1 = GpuDevice(1, "GPU-77aa", "NVIDIA H100 80GB HBM3", 80 * GiB, 0, 97.0)


def evidence(**changes: Any) -> RunEvidence:
    base = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=4242,
        gpus=(H100, H100_1),
        gpu_processes=(GpuProcess(0, 4242, 30 * GiB), GpuProcess(0, 4250, 1 * GiB)),
        gpu_idle_for_s=2100.0,
        gpu_idle_window_s=1800.0,
    )
    return dataclasses.replace(base, **changes)


# --- gpu-idle -------------------------------------------------------------------------------------


def test_gpu_idle() -> None:
    findings = explain(evidence())
    assert rules_of(findings) == ["gpu-idle"]
    (f,) = findings
    assert f.title == "GPU 0 idle for 35m00s while the job holds 31.0G"
    assert f.evidence == (
        "GPU 0 (NVIDIA H100 80GB HBM3): the job holds 31.0G (pid 4242, 4250) of 80.0G, utilisation 0% (idle)",
        "idle for 35m00s (window 30m00s)",
    )
    assert f.pids == (4242, 4250)
    assert f.severity == "warning"
    assert_well_formed(findings)


def test_gpu_idle_falls_back_to_the_hang_window() -> None:
    ev = evidence(gpu_idle_window_s=None, hang_window_s=600.0, quiet_for_s=2100.0)
    assert "gpu-idle" in rules_of(explain(ev))


def test_gpu_idle_with_memory_unknown_per_process() -> None:
    # NVML gives no per-process memory inside some containers: holding is still holding.
    (f,) = explain(evidence(gpu_processes=(GpuProcess(1, 4242, None),), gpus=()))
    assert f.evidence[0] == "GPU 1: the job holds 0B (pid 4242)"


def test_no_gpu_idle_below_the_window() -> None:
    assert explain(evidence(gpu_idle_for_s=1799.0)) == []


def test_no_gpu_idle_without_a_window_or_a_measure() -> None:
    assert explain(evidence(gpu_idle_window_s=None)) == []
    assert explain(evidence(gpu_idle_for_s=None)) == []


def test_no_gpu_idle_when_the_job_holds_no_gpu_memory() -> None:
    assert explain(evidence(gpu_processes=(GpuProcess(0, 4242, 0),))) == []
    assert explain(evidence(gpu_processes=())) == []


# --- stray-gpu-process ----------------------------------------------------------------------------

# S5: a background training loop outlived its experiment runner, holding 5.5 GiB for 1.5 days.
ORPHAN = GpuOwner(31337, 1, "ana", "python -m exp.train_loop --seed 3", "17", job_live=False, age_s=129600)
BY_HAND = GpuOwner(2222, 2100, "bo", "python notebook_kernel.py")
LIVE = GpuOwner(4242, 4200, "ana", "python train.py", job_id="21", job_live=True)


def test_a_stray_of_an_ended_job_reparented_to_init() -> None:
    (f,) = stray_gpu_findings([GpuProcess(0, 31337, 5632 << 20)], {31337: ORPHAN})
    assert f.rule == "stray-gpu-process"
    assert f.title == "pid 31337 holds 5.5G on GPU 0 and belongs to no live job"
    assert "was part of job 17, which has ended" in f.summary
    assert "with no parent left to end it" in f.summary
    assert f.evidence == (
        "GPU 0: pid 31337 holds 5.5G",
        "pid 31337 (python -m exp.train_loop --seed 3), user ana, running for 1d12h",
        "its parent is gone: re-parented to init (pid 1), an orphan of whatever started it",
        "job 17: ended",
    )
    assert "`kill 31337`" in f.remedy and "jobwarden orphans --kill" in f.remedy and "runs as ana" in f.remedy
    assert f.pids == (31337,)
    assert_well_formed([f])


def test_a_process_of_no_job_on_two_gpus() -> None:
    procs = [GpuProcess(0, 2222, 1 * GiB), GpuProcess(1, 2222, 2 * GiB)]
    (f,) = stray_gpu_findings(procs, {2222: BY_HAND})
    assert f.title == "pid 2222 holds 3.0G on GPU 0, 1 and belongs to no live job"
    assert "belongs to no jobwarden job" in f.summary
    assert "parent pid 2100" in f.evidence


def test_strays_come_largest_first_and_live_jobs_and_unknown_pids_are_left_alone() -> None:
    procs = [
        GpuProcess(0, 2222, 1 * GiB),
        GpuProcess(0, 4242, 70 * GiB),  # a live job's: not a stray
        GpuProcess(1, 31337, 5632 << 20),
        GpuProcess(1, 555, 9 * GiB),  # not in /proc here (another container): nothing to say
    ]
    owners = {2222: BY_HAND, 4242: LIVE, 31337: ORPHAN}
    assert [f.pids for f in stray_gpu_findings(procs, owners)] == [(31337,), (2222,)]


def test_no_strays() -> None:
    assert stray_gpu_findings([GpuProcess(0, 4242, 70 * GiB)], {4242: LIVE}) == []
    assert stray_gpu_findings([], {}) == []

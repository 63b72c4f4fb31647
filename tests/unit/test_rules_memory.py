"""oom-kill and cuda-oom, and how OOM evidence changes what the death rules say about a SIGKILL."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobwarden.model import Finding
from jobwarden.observations import OomEvidence, ProcessDeath
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.memory import oom_killed

from .test_rules import assert_well_formed, rules_of

MiB = 1 << 20
WORKER = ProcessDeath(4702, 4665, "python train.py", 1_700_000_100.0, None, "SIGKILL")
# Kernel lines of a measured cgroup OOM kill (docs/measurements.md, "OOM evidence"), the worker's pid.
KERNEL_LINES = (
    "Memory cgroup out of memory: Killed process 4702 (python3) total-vm:1067156kB, anon-rss:301864kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:700kB oom_score_adj:0",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/jobwarden/17,"
    "task_memcg=/jobwarden/17,task=python3,pid=4702,uid=0",
)
CGROUP_OOM = OomEvidence(
    "cgroup-v1", 1, limit_bytes=300 * MiB, peak_bytes=299 * MiB, victims=(4702,), kernel_lines=KERNEL_LINES
)


def evidence(**changes: Any) -> RunEvidence:
    base = RunEvidence(
        state="failed",
        exit_code=None,
        signal="SIGKILL",
        end_reason="signalled",
        pid=4665,
        log_tail=("epoch 3 step 1200 loss 1.02",),
    )
    return dataclasses.replace(base, **changes)


def only(findings: list[Finding], rule: str) -> Finding:
    (found,) = [f for f in findings if f.rule == rule]
    return found


# --- oom-kill -------------------------------------------------------------------------------------


def test_cgroup_oom_of_the_main_process_is_oom_kill_not_killed_externally() -> None:
    oom = dataclasses.replace(CGROUP_OOM, victims=(4665,), kernel_lines=())
    findings = explain(evidence(oom=oom))
    assert rules_of(findings) == ["oom-kill"]
    (f,) = findings
    assert f.title == "Killed by the kernel OOM killer: the job's memory cgroup at its 300.0M limit"
    assert "(the main process)" in f.summary
    assert "peak 299.0M of limit 300.0M" in f.summary
    assert "mechanism: cgroup-v1; OOM kills counted during the run: 1" in f.evidence
    assert f.pids == (4665,)
    assert "--mem-limit above 300.0M" in f.remedy
    assert_well_formed(findings)


def test_a_worker_named_by_the_kernel_log() -> None:
    ev = evidence(state="running", signal=None, end_reason=None, oom=CGROUP_OOM, deaths=(WORKER,))
    f = only(explain(ev), "oom-kill")
    assert f.pids == (4702,)
    assert "pid 4702 (python train.py): killed by SIGKILL" in f.evidence
    assert f"kernel: {KERNEL_LINES[0]}" in f.evidence
    assert any(e.startswith("kernel: oom-kill:constraint=CONSTRAINT_MEMCG") for e in f.evidence)


def test_a_victim_named_by_the_kernel_that_jobwarden_never_saw() -> None:
    # Born and OOM-killed between two scans (docs/measurements.md, "Exit status of a process that is not
    # our child"): the cgroup is the job's: it counts.
    ev = evidence(state="running", signal=None, end_reason=None, oom=CGROUP_OOM)
    f = only(explain(ev), "oom-kill")
    assert "pid 4702: named by the kernel, not seen by jobwarden" in f.evidence


def test_memory_watchdog() -> None:
    oom = OomEvidence("watchdog", 1, limit_bytes=8 << 30, peak_bytes=(8 << 30) + 12 * MiB)
    f = only(explain(evidence(oom=oom)), "oom-kill")
    assert f.title == "Killed by jobwarden's memory watchdog (--mem-limit 8.0G)"
    assert "jobwarden's memory watchdog found the job over its --mem-limit" in f.summary
    assert "memory: peak 8.0G of limit 8.0G" in f.evidence


def test_host_oom_without_names_is_said_to_be_inferred() -> None:
    f = only(explain(evidence(oom=OomEvidence("host", 1))), "oom-kill")
    assert f.title == "Killed by the kernel OOM killer: the machine ran out of memory"
    assert "Inferred" in f.summary
    assert "--mem-limit" in f.remedy


def test_the_limit_falls_back_to_the_runs_mem_limit() -> None:
    oom = OomEvidence("cgroup-v2", 2)
    f = only(explain(evidence(oom=oom, mem_limit_bytes=2 << 30)), "oom-kill")
    assert "at its 2.0G limit" in f.title


# --- where oom-kill must not fire, and killed-externally stays --------------------------------------


def test_sigkill_without_oom_evidence_stays_killed_externally() -> None:
    assert rules_of(explain(evidence())) == ["killed-externally"]
    assert rules_of(explain(evidence(oom=OomEvidence("cgroup-v2", 0)))) == ["killed-externally"]


def test_host_oom_that_named_someone_else_is_not_the_jobs() -> None:
    # /proc/vmstat oom_kill rose, but the kernel log says it killed pid 999, another user's process.
    oom = OomEvidence("host", 1, victims=(999,), kernel_lines=("Out of memory: Killed process 999 (java)",))
    assert oom_killed(evidence(oom=oom)) == ()
    assert rules_of(explain(evidence(oom=oom))) == ["killed-externally"]


def test_oom_counted_but_nothing_was_killed() -> None:
    # cgroup v1 oom_control counts an OOM that reclaim solved; no process died of it.
    ev = evidence(state="failed", signal=None, exit_code=1, oom=OomEvidence("cgroup-v1", 1))
    assert rules_of(explain(ev)) == ["exit-code"]


def test_jobwardens_own_sigkill_after_the_stop_grace_is_not_an_oom_victim() -> None:
    ev = evidence(state="stopped", end_reason="stopped", oom=OomEvidence("cgroup-v1", 1))
    assert rules_of(explain(ev)) == ["stopped-by-user"]


def test_a_sigterm_in_a_run_with_oom_evidence_stays_killed_externally() -> None:
    # Only a SIGKILL is the OOM killer's; a SIGTERM in the same run came from elsewhere.
    ev = evidence(signal="SIGTERM", oom=OomEvidence("cgroup-v1", 1))
    assert rules_of(explain(ev)) == ["killed-externally"]


# --- cuda-oom -------------------------------------------------------------------------------------

# PyTorch >= 2.1 wording (from a vLLM issue log; figures as printed there)
NEW_FORMAT = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 698.00 MiB. GPU 0 has a total capacity of "
    "23.56 GiB of which 559.00 MiB is free. Process 81610 has 2.42 GiB memory in use. Including non-PyTorch "
    "memory, this process has 21.01 GiB memory in use. Of the allocated memory 20.08 GiB is allocated by "
    "PyTorch, and 614.16 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
    "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# PyTorch 1.x wording
OLD_FORMAT = (
    "RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; "
    "130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)"
)


def failed(*lines: str, **changes: Any) -> RunEvidence:
    return evidence(signal=None, exit_code=1, end_reason="exited", log_tail=("step 12", *lines), **changes)


def test_cuda_oom_new_format_with_every_figure_and_another_process() -> None:
    findings = explain(failed(NEW_FORMAT))
    assert rules_of(findings) == ["cuda-oom"]  # no "exited 1, no clearer sign why" after it
    f = findings[0]
    assert f.title == "CUDA out of memory on GPU 0 allocating 698.00 MiB"
    assert f.summary.startswith("A GPU allocation of 698.00 MiB failed with only 559.00 MiB of 23.56 GiB")
    assert (
        "tried to allocate: 698.00 MiB; GPU total: 23.56 GiB; free: 559.00 MiB; held by this process: "
        "21.01 GiB; reserved by PyTorch but unallocated: 614.16 MiB"
    ) in f.evidence
    assert "another process on the GPU: pid 81610 holds 2.42 GiB" in f.evidence
    assert f.remedy.startswith("Another process holds memory on this GPU (pid 81610)")
    assert "expandable_segments:True" in f.remedy
    assert "gradient accumulation" in f.remedy
    assert f.pids == (4665,)
    assert_well_formed(findings)


def test_cuda_oom_old_format() -> None:
    f = only(explain(failed(OLD_FORMAT)), "cuda-oom")
    assert f.title == "CUDA out of memory on GPU 0 allocating 36.00 MiB"
    assert "only 47.06 MiB of 7.93 GiB free" in f.summary
    assert "expandable_segments" not in f.remedy  # no sign of fragmentation in this message
    assert "nvidia-smi" in f.remedy


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA error: out of memory",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "17179869184 bytes.",
    ],
)
def test_cuda_oom_other_wordings(line: str) -> None:
    f = only(explain(failed(line)), "cuda-oom")
    assert f.evidence[0] == f"output: {line}"
    assert f.summary.startswith("A GPU memory allocation failed")


def test_cuda_oom_when_hung_after_the_error() -> None:
    # One rank hit the OOM and died; this one is stuck in the collective, still running.
    ev = evidence(state="running", signal=None, end_reason=None, hang_window_s=600.0, log_tail=(OLD_FORMAT,))
    assert "cuda-oom" in rules_of(explain(ev))


def test_an_oom_the_job_caught_and_survived_is_not_a_finding() -> None:
    # A batch-size finder: OOM at 64, retried at 32, finished.
    tail = (OLD_FORMAT, "batch size 64 does not fit; retrying with 32", "done")
    assert explain(evidence(state="succeeded", signal=None, exit_code=0, log_tail=tail)) == []
    assert explain(evidence(state="running", signal=None, end_reason=None, log_tail=tail)) == []


def test_host_memory_error_is_not_cuda_oom() -> None:
    assert "cuda-oom" not in rules_of(explain(failed("MemoryError", "out of memory: cannot allocate 4 GiB")))


def test_a_long_line_is_cut_in_the_evidence() -> None:
    f = only(explain(failed(NEW_FORMAT + " " + "x" * 500)), "cuda-oom")
    assert len(f.evidence[0]) <= len("output: ") + 400
    assert f.evidence[0].endswith("...")

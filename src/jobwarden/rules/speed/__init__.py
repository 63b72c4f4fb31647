"""Speed rules: why a running job is slow (DESIGN.md "Speed rules"). Pure, as every rule family: evidence
in, findings out.

SPEED_RULES names them for the parts that act on any of them without judging (the automatic profile when
one becomes current, the `slowed` notification), so those never import the rules themselves. `judge`
asks every rule judged from counters (rules.speed.evidence.SpeedEvidence), in the order they are listed:
a cause before the slowdown it explains."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from jobwarden.model import Finding

if TYPE_CHECKING:
    from jobwarden.rules.speed.evidence import SpeedEvidence

SPEED_RULES = frozenset(
    {
        "slowed-down",
        "input-bound",
        "data-loading-in-main",
        "cpu-throttled",
        "cpu-contention",
        "cpu-oversubscribed",
        "io-bound",
        "memory-thrash",
        "gil-bound",
        "periodic-stall",
        "worker-respawn",
        "gpu-not-used",
        "gpu-throttled",
        "gpu-shared",
        "straggler",
    }
)


def _judges() -> list[Callable[[SpeedEvidence], Finding | None]]:
    from jobwarden.rules.speed import cpu, gpu, loading, ranks, stalls, steps, storage, threads

    # CPU causes first and only one of them: a quota, then the job's own threads, then its neighbours
    return [
        gpu.gpu_not_used,
        gpu.gpu_shared,
        gpu.gpu_throttled,
        cpu.cpu_throttled,
        cpu.cpu_oversubscribed,
        cpu.cpu_contention,
        storage.io_bound,
        storage.memory_thrash,
        stalls.periodic_stall,
        loading.input_bound,
        loading.data_loading_in_main,
        steps.slowed_down,
        threads.worker_respawn,
        threads.gil_bound,
        ranks.straggler,
    ]


CPU_CAUSES = ("cpu-throttled", "cpu-oversubscribed", "cpu-contention")
JUDGED = (
    "gpu-not-used",
    "gpu-shared",
    "gpu-throttled",
    *CPU_CAUSES,
    "io-bound",
    "memory-thrash",
    "input-bound",
    "data-loading-in-main",
    "slowed-down",
    "worker-respawn",
    "gil-bound",
    "straggler",
)


def judge(evidence: SpeedEvidence) -> list[Finding]:
    """The speed findings `evidence` supports, causes first, one CPU cause at most."""
    found: list[Finding] = []
    for rule in _judges():
        finding = rule(evidence)
        if finding is None:
            continue
        if finding.rule in CPU_CAUSES and any(f.rule in CPU_CAUSES for f in found):
            continue
        found.append(finding)
    return found

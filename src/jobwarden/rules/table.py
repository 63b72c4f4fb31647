"""Every per-run rule in one table, root cause first (rules.verdict says why in this order): its id, the
pure function that judges it, and whether the shim may conclude it while the run is live. Adding a rule is
one entry here, beside its module, plus its id in model.ROOT_CAUSE_ORDER (which `ps` reads without loading
the rules; a test keeps the two equal).

Rules without a judge here are found at the end, by the exit-status and aftermath families of
rules.death (one exit-status finding per run). `stray-gpu-process` is machine-wide: rules.gpu.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from jobwarden.model import Finding
from jobwarden.rules import gpu, hang, memory
from jobwarden.rules.evidence import RunEvidence

Judge = Callable[[RunEvidence], Finding | None]


class Rule(NamedTuple):
    id: str
    judge: Judge | None = None  # None: found by rules.death when the run has ended
    live: bool = False  # the shim may conclude it while the run is live (shim.watch.diagnosis)
    explains_a_hang: bool = False  # a hang it explains needs no `no-progress` on top
    if_unexplained: bool = False  # judged only when no rule that explains a hang fired
    # How a live finding stops being true (shim.record.findings): "event" never (a death, a kill: it
    # happened), "hang" when the run shows progress again, "state" when what it saw is gone (the process
    # resumed, the GPU computes again)
    lasts: str = "event"


RULES: tuple[Rule, ...] = (
    # resources that ran out: they kill workers and processes
    Rule("oom-kill", memory.oom_kill, live=True),
    Rule("cuda-oom", memory.cuda_oom, live=True),
    # a worker that died: its parent then hangs or fails
    Rule("pool-worker-lost", hang.pool_worker_lost, live=True, explains_a_hang=True),
    Rule("dataloader-worker-killed", hang.dataloader_worker_killed, live=True, explains_a_hang=True),
    # processes that cannot run: whatever waits on them hangs
    Rule("process-stopped", hang.process_stopped, live=True, explains_a_hang=True, lasts="state"),
    Rule("uninterruptible-io", hang.uninterruptible_io, live=True, explains_a_hang=True, lasts="hang"),
    # hang signatures: a rank stuck on a fork deadlock leaves its peers waiting in the collective
    Rule("fork-deadlock", hang.fork_deadlock, live=True, explains_a_hang=True, lasts="hang"),
    Rule("collective-hang", hang.collective_hang, live=True, explains_a_hang=True, lasts="hang"),
    # any other hang the kernel can explain: what the main process waits for, and who for (a signature
    # above, where one fired, is the sharper account of the same wait)
    Rule("wait-chain", hang.wait_chain, live=True, explains_a_hang=True, if_unexplained=True, lasts="hang"),
    Rule("no-progress", hang.no_progress, live=True, if_unexplained=True, lasts="hang"),
    # how the run ended: one exit-status finding (rules.death), often the consequence of the above
    Rule("stopped-by-user"),
    Rule("cancelled-by-engine"),
    Rule("machine-rebooted"),  # recorded by control.boot.reboot when a run of an earlier boot is looked at
    Rule("dependency-failed"),  # recorded by the shim: a job it was to run after (--after) did not succeed
    Rule("timeout"),
    Rule("python-exception"),
    Rule("native-crash"),
    Rule("terminal-hangup"),
    Rule("broken-pipe"),
    Rule("killed-externally"),
    Rule("exit-code"),
    # symptoms and the aftermath
    Rule("gpu-idle", gpu.gpu_idle, live=True, lasts="state"),
    Rule("disk-full"),
    Rule("notify-failed"),  # recorded by the shim: a notification could not be delivered
    Rule("orphans-left"),
    Rule("supervisor-lost"),
)

ORDER = tuple(rule.id for rule in RULES)
LIVE = frozenset(rule.id for rule in RULES if rule.live)
EXPLAINS_A_HANG = frozenset(rule.id for rule in RULES if rule.explains_a_hang)
ENDS_WITH_THE_HANG = frozenset(rule.id for rule in RULES if rule.lasts == "hang")
# the rules before the exit-status family: a cause the run's end may only follow from
CAUSES = frozenset(ORDER[: ORDER.index("stopped-by-user")])

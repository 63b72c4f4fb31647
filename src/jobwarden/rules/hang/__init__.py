"""Hung or stalled runs: one module per signature. Each rule is a pure function of RunEvidence.

`process-stopped`, `pool-worker-lost` and `dataloader-worker-killed` fire on their evidence at once; the
others need the watchdog's verdict that the run is hung (`RunEvidence.hang_window_s` set), except that
PyTorch's own NCCL watchdog messages in the output are such a verdict for `collective-hang`.
"""

from jobwarden.rules.hang.collective import collective_hang
from jobwarden.rules.hang.fork import fork_deadlock
from jobwarden.rules.hang.progress import no_progress
from jobwarden.rules.hang.states import process_stopped, uninterruptible_io
from jobwarden.rules.hang.waits import wait_chain
from jobwarden.rules.hang.workers import dataloader_worker_killed, pool_worker_lost

__all__ = [
    "collective_hang",
    "dataloader_worker_killed",
    "fork_deadlock",
    "no_progress",
    "pool_worker_lost",
    "process_stopped",
    "uninterruptible_io",
    "wait_chain",
]

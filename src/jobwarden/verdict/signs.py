"""The signs of progress as the hang watchdog (shim.watch.watchdog) counts them: its default window and
the floors below which CPU, I/O and GPU use are not work. `health` judges a run's activity by the same."""

# 10 minutes: longer than a checkpoint write, an evaluation pass or a data-loader warm-up that prints
# nothing, yet short against the hours a stuck job otherwise burns. On hang the default action only dumps
# stacks (the job is kept), so a false alarm costs nothing but a finding.
DEFAULT_HANG_TIMEOUT_S = 600.0
CPU_FLOOR_PERCENT = 5.0  # of one core, summed over the tree
IO_FLOOR_BYTES = 4096  # per observation (rchar + wchar: storage, pipes and sockets alike)
GPU_FLOOR_PERCENT = 5.0

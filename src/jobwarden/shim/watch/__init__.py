"""The watchers of a live run: samples, the hang watchdog, progress, speed and its stacks, ranks, GPUs,
the automatic profile, and the live diagnosis that judges what they saw."""

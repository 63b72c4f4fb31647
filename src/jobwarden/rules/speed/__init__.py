"""Speed rules: why a running job is slow (DESIGN.md "Speed rules"). Pure, as every rule family: evidence
in, findings out.

SPEED_RULES names them for the parts that act on any of them without judging (the automatic profile when
one becomes current, the `slowed` notification), so those never import the rules themselves."""

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
    }
)

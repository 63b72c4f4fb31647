"""jobwarden for multi-node training on Ray: one supervisor per node, each a zero-CPU actor that runs
`jobwarden run --engine ray` attached, so every node's ranks are supervised where they run and a killed
driver or actor takes its ranks with it (docs/cluster.md, README "With Ray").

    import ray
    from jobwarden.ray import run_on_nodes

    ray.init()
    results = run_on_nodes(["torchrun", "--nnodes=2", "train.py"])

A frontend like the CLI: imported only by a Ray driver, never on the path of `jobwarden run`; Ray itself
is imported inside the functions that need it."""

from jobwarden.ray.warden import NodeResult, NodesFailed, explain_group, run_on_nodes

__all__ = ["NodeResult", "NodesFailed", "explain_group", "run_on_nodes"]

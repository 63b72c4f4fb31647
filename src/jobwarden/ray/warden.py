"""The warden actors: one per alive Ray node (NodeAffinitySchedulingStrategy, zero CPUs, never
restarted), each running `python -m jobwarden run --engine ray --group G --node N -- COMMAND` attached
and reporting the node's exit status with its `explain --json` verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from jobwarden.errors import UsageError


class NodeResult(NamedTuple):
    """What one node's supervisor reported. exit_code is the job's status as `jobwarden run` exits with
    it (128+N for a signal); None when the warden itself was lost (its node or worker died)."""

    node_rank: int
    node: str  # the Ray node id
    address: str  # the node's IP address
    exit_code: int | None
    verdict: dict[str, Any] | None  # `jobwarden explain --json` of the node's run, where it could be read
    error: str | None = None  # why there is no exit code

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        where = f"node {self.node_rank} ({self.node[:12]} at {self.address})"
        if self.exit_code is None:
            return f"{where}: supervisor lost: {self.error}"
        findings = (self.verdict or {}).get("findings") or []
        finding = f": {findings[0].get('rule')}: {findings[0].get('title')}" if findings else ""
        return f"{where}: exit {self.exit_code}{finding}"


class NodesFailed(RuntimeError):
    """Raised by run_on_nodes(check=True) when a node's job failed; .results has every node's result."""

    def __init__(self, results: Sequence[NodeResult]) -> None:
        self.results = list(results)
        failed = [r.summary() for r in self.results if not r.ok]
        super().__init__(f"{len(failed)} of {len(self.results)} nodes failed: " + "; ".join(failed))


def run_on_nodes(
    command: Sequence[str],
    *,
    group: str | None = None,
    home: str | None = None,
    group_dir: str | None = None,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    rank_per_node: bool = False,
    check: bool = True,
) -> list[NodeResult]:
    """Run `command` under jobwarden on every alive node of the connected Ray cluster (ray.init first),
    one supervisor per node; block until all ended. Each node's command gets NODE_RANK, NNODES and
    MASTER_ADDR (node 0's address), and the same as torchrun's PET_* defaults. `home` is the node-local
    JOBWARDEN_HOME ("{node}" is replaced by the Ray node id), default the node's own; `options` are more
    `jobwarden run` flags; rank_per_node passes `--rank NODE_RANK` (a command that is one rank). Raises
    NodesFailed if a node failed and check."""
    import ray

    if not command:
        raise UsageError("run_on_nodes: no command given", "e.g. run_on_nodes(['python', 'train.py'])")
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: str(n["NodeID"]))
    group = group or default_group()
    wardens = [_start_warden(n["NodeID"]) for n in nodes]
    pending = {
        warden.supervise.remote(
            _argv(command, group, n["NodeID"], rank, home, group_dir, options, rank_per_node),
            _env(env, rank, len(nodes), str(nodes[0]["NodeManagerAddress"]), home, n["NodeID"]),
        ): rank
        for rank, (warden, n) in enumerate(zip(wardens, nodes, strict=True))
    }
    results = [_result(ref, rank, nodes[rank]) for ref, rank in pending.items()]
    if check and not all(r.ok for r in results):
        raise NodesFailed(results)
    return results


def default_group() -> str:
    """ray-<the Jobs submission id> when the driver is a Ray Jobs entrypoint, else ray-<Ray's job id>:
    every node's records of one job meet under one group."""
    import ray

    from jobwarden.control.engine import ray_submission_id

    return f"ray-{ray_submission_id(os.environ) or ray.get_runtime_context().get_job_id()}"


def _argv(
    command: Sequence[str],
    group: str,
    node: str,
    rank: int,
    home: str | None,
    group_dir: str | None,
    options: Sequence[str],
    rank_per_node: bool,
) -> list[str]:
    argv = [sys.executable, "-m", "jobwarden", "run", "--engine", "ray", "--group", group, "--node", node]
    argv += ["--name", f"{group}-n{rank}"]
    argv += ["--rank", str(rank)] if rank_per_node else []
    argv += ["--group-dir", group_dir] if group_dir else []
    return [*argv, *options, "--", *command]


def _env(
    extra: Mapping[str, str] | None, rank: int, nnodes: int, master: str, home: str | None, node: str
) -> dict[str, str]:
    env = {**(extra or {}), "NODE_RANK": str(rank), "NNODES": str(nnodes), "MASTER_ADDR": master}
    # torchrun takes its --nnodes, --node-rank and --master-addr from PET_<NAME> when not given
    env.update(PET_NNODES=str(nnodes), PET_NODE_RANK=str(rank), PET_MASTER_ADDR=master)
    if home:
        env["JOBWARDEN_HOME"] = home.replace("{node}", node)
    return env


def _start_warden(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return Warden.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def _result(ref: Any, rank: int, node: Mapping[str, Any]) -> NodeResult:
    import ray

    where = (rank, str(node["NodeID"]), str(node["NodeManagerAddress"]))
    try:
        exit_code, verdict = ray.get(ref)
    except ray.exceptions.RayError as e:  # the actor, its worker or its node died
        return NodeResult(*where, None, None, f"{type(e).__name__}: {str(e).splitlines()[0]}")
    return NodeResult(*where, exit_code, verdict)


class _Warden:
    """Runs on its node: the attached `jobwarden run` as a child in its own session (the raylet's
    clean-up of the worker's process group must not SIGKILL the CLI and its shim together: the shim
    would leave no end record and the job would run on), dying with this worker (parent-death signal)."""

    def supervise(self, argv: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
        from jobwarden.osapi.process import die_with_parent

        parent = os.getpid()
        full_env = {**os.environ, **env}
        full_env.pop("JOBWARDEN_JOB_ID", None)  # a warden inside a supervised job is not that job
        proc = subprocess.Popen(argv, env=full_env, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: die_with_parent(parent))  # fmt: skip
        code = proc.wait()
        name = argv[argv.index("--name") + 1]
        return (code if code >= 0 else 128 - code), _verdict(name, full_env)


def _verdict(name: str, env: dict[str, str]) -> dict[str, Any] | None:
    explain = [sys.executable, "-m", "jobwarden", "explain", "--json", name]
    done = subprocess.run(explain, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    try:
        verdict: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        return None
    return verdict


def _remote_warden() -> Any:
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(_Warden)


class _LazyWarden:
    """The actor class, made on first use: importing this module must not import Ray."""

    _cls: Any = None

    def options(self, **kwargs: Any) -> Any:
        if _LazyWarden._cls is None:
            _LazyWarden._cls = _remote_warden()
        return _LazyWarden._cls.options(**kwargs)


Warden = _LazyWarden()

"""The warden actors: one per alive Ray node (NodeAffinitySchedulingStrategy, zero CPUs, never
restarted), each running `python -m jobwarden run --engine ray --group G --node N -- COMMAND` attached
and reporting the node's exit status with its `explain --json` verdict."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from jobwarden.errors import UsageError


class NodeResult(NamedTuple):
    """What one node's supervisor reported. exit_code is the job's status as `jobwarden run` exits with
    it (128+N for a signal); None when the warden was stopped (another node failed) or lost (its node or
    worker died)."""

    node_rank: int
    node: str  # the Ray node id
    address: str  # the node's IP address
    exit_code: int | None
    verdict: dict[str, Any] | None  # `jobwarden explain --json` of the node's run, where it could be read
    error: str | None = None  # why there is no exit code: stopped after another node failed, or lost

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        where = f"node {self.node_rank} ({self.node[:12]} at {self.address})"
        status = f"exit {self.exit_code}" if self.exit_code is not None else self.error
        findings = (self.verdict or {}).get("findings") or []
        finding = f": {findings[0].get('rule')}: {findings[0].get('title')}" if findings else ""
        return f"{where}: {status}{finding}"


class NodesFailed(RuntimeError):
    """Raised by run_on_nodes(check=True) when a node's job failed; .results has every node's result,
    .group the group whose records `explain_group` merges into one verdict."""

    def __init__(self, results: Sequence[NodeResult], group: str = "") -> None:
        self.results, self.group = list(results), group
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
    stop_others_after_s: float | None = 30.0,
    check: bool = True,
) -> list[NodeResult]:
    """Run `command` under jobwarden on every alive node of the connected Ray cluster (ray.init first),
    one supervisor per node; block until all ended. Each node's command gets NODE_RANK, NNODES and
    MASTER_ADDR (node 0's address), and the same as torchrun's PET_* defaults. `home` is the node-local
    JOBWARDEN_HOME ("{node}" is replaced by the Ray node id), default the node's own; `group_dir` the
    group's directory on a file system every node shares ("{group}" is replaced by the group id), default
    each node's home/groups/<group> (node-local: no verdict across nodes); `options` are more
    `jobwarden run` flags; rank_per_node passes `--rank NODE_RANK` (a command that is one rank).

    When a node fails, the others get stop_others_after_s to end on their own (their peers' failure often
    ends them), then their wardens are killed: each node's jobwarden ends its run as an engine stop
    (`cancelled-by-engine`) instead of waiting in a collective that will never complete (None: wait for
    every node). Raises NodesFailed if a node failed and check."""
    import ray

    if not command:
        raise UsageError("run_on_nodes: no command given", "e.g. run_on_nodes(['python', 'train.py'])")
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: str(n["NodeID"]))
    if not nodes:
        raise UsageError(
            "run_on_nodes: the Ray cluster has no alive node", "ray.init() a running cluster first"
        )
    group = group or default_group()
    group_dir = group_dir.replace("{group}", group) if group_dir else None
    runs = [
        _NodeRun(
            rank,
            n,
            _argv(command, group, n["NodeID"], rank, home, group_dir, options, rank_per_node),
            _env(env, rank, len(nodes), str(nodes[0]["NodeManagerAddress"]), home, n["NodeID"]),
        )
        for rank, n in enumerate(nodes)
    ]
    results = _gather(runs, stop_others_after_s)
    if check and not all(r.ok for r in results):
        raise NodesFailed(results, group)
    return results


def explain_group(group: str, group_dir: str | None = None) -> dict[str, Any]:
    """`jobwarden explain --group --json`: one verdict for every node's ranks (root cause, collateral),
    from the records they wrote to the shared group directory (run_on_nodes' group_dir)."""
    argv = [sys.executable, "-m", "jobwarden", "explain", "--group", group, "--json"]
    argv += ["--group-dir", group_dir.replace("{group}", group)] if group_dir else []
    done = subprocess.run(argv, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    verdict: dict[str, Any] = json.loads(done.stdout)
    return verdict


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


class _NodeRun:
    """One node's part: its warden and the call that runs the node's command."""

    def __init__(self, rank: int, node: Mapping[str, Any], argv: list[str], env: dict[str, str]) -> None:
        self.rank, self.node_id, self.address = rank, str(node["NodeID"]), str(node["NodeManagerAddress"])
        self.name, self.env = argv[argv.index("--name") + 1], env
        self.warden = _remote(_Warden).options(scheduling_strategy=self.pinned()).remote()
        self.call = self.warden.supervise.remote(argv, env)
        self.stopped: str | None = None  # why the warden was killed, if it was

    def pinned(self) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(self.node_id, soft=False)

    def result(self) -> NodeResult:
        import ray

        where = (self.rank, self.node_id, self.address)
        try:
            exit_code, verdict = ray.get(self.call)
        except ray.exceptions.RayError as e:  # killed by us, or its worker or node died
            if self.stopped:  # its jobwarden ended the run as an engine stop: read how, on its node
                reader = _remote(_verdict).options(scheduling_strategy=self.pinned(), num_cpus=0)
                return NodeResult(*where, None, ray.get(reader.remote(self.name, self.env)), self.stopped)
            return NodeResult(*where, None, None, f"{type(e).__name__}: {str(e).splitlines()[0]}")
        return NodeResult(*where, exit_code, verdict)


def _gather(runs: list[_NodeRun], stop_others_after_s: float | None) -> list[NodeResult]:
    """Every node's result, in rank order; the wardens still running stop_others_after_s after the first
    failure are killed (each node's jobwarden then stops its run, as it would for `ray job stop`)."""
    import ray

    results: dict[int, NodeResult] = {}
    pending = {run.call: run for run in runs}
    deadline: float | None = None
    armed = stop_others_after_s is None  # once: the nodes it stops fail too, and must not re-arm it
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        if not ready:  # the others had their time after a node failed
            failed = ", ".join(str(r.node_rank) for r in results.values() if not r.ok)
            for run in pending.values():
                run.stopped = f"stopped {stop_others_after_s:g} s after node {failed} failed"
                ray.kill(run.warden, no_restart=True)
            deadline = None
            continue
        result = pending.pop(ready[0]).result()
        results[result.node_rank] = result
        if not result.ok and not armed and stop_others_after_s is not None:
            armed, deadline = True, time.monotonic() + stop_others_after_s
    return [results[rank] for rank in sorted(results)]


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
        return (code if code >= 0 else 128 - code), _verdict(name, env)


# how long a stopped node's jobwarden may take to end its run: Ray's stop wait is seconds, plus slack
_VERDICT_WAIT_S = 120


def _verdict(name: str, env: dict[str, str]) -> dict[str, Any] | None:
    """`explain --json` of the node's run once it has ended (`wait` first: a stopped run is still
    ending), read on the node from its node-local home."""
    jobwarden, full_env = [sys.executable, "-m", "jobwarden"], {**os.environ, **env}
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([*jobwarden, "wait", name], env=full_env, capture_output=True, timeout=_VERDICT_WAIT_S)
    done = subprocess.run(
        [*jobwarden, "explain", "--json", name], env=full_env, capture_output=True, text=True
    )
    try:
        verdict: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        return None
    return verdict


_REMOTE: dict[object, Any] = {}


def _remote(what: object) -> Any:
    """The warden actor class or the verdict task, made on first use: importing this module must not
    import Ray. Zero CPUs: a supervisor must never take a slot from the training it watches."""
    import ray

    if what not in _REMOTE:
        _REMOTE[what] = ray.remote(num_cpus=0, max_restarts=0)(what) if what is _Warden else ray.remote(what)
    return _REMOTE[what]

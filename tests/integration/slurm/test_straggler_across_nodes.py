"""`straggler` across nodes (issue 26, item 2) on the session's throwaway Slurm (conftest.py): one task per
node (n1, n2), each under its own jobwarden with its own home, each a real gloo rank (torch.distributed,
MASTER_ADDR on the cluster's loopback: both slurmd listen on 127.0.0.1) of one 2-rank job. Neither shim can
judge it alone (one rank each): `explain --group` merges the rank views both nodes publish.

One run, three phases (one job's start-up paid once): the ranks run alike until both were looked at long
enough to be compared, and no straggler may be named meanwhile (a false one fails the test at once); then
rank 1 sleeps in each step, so rank 0 waits for it in its all_reduce, and `explain --group` names rank 1,
its node and its pid; after the end, it still names it from the last views, saying they are those.

Handshake: the group's verdict is polled for with a deadline; the phase switch is a file the job looks
for each step; the job is then cancelled (scancel) and srun reaped."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_rootcause import free_port
from tests.slurmcluster import SlurmCluster
from tests.support import eventually

from .test_group_verdict import explain, node_home

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(300)]
JW = f"{sys.executable} -m jobwarden"
JOB = Path(__file__).resolve().parents[1] / "jobs" / "ranks_job.py"
COMPARED_WITHIN_S = 180.0  # torch imported by both ranks on two loaded cores, 12 looks at each, a margin
NAMED_WITHIN_S = 120.0  # a window of 20 s after the switch, and a margin


def group_json(slurm_cluster: SlurmCluster, tmp_path: Path, shared: Path) -> dict[str, Any] | None:
    if not (shared / "attempt-0" / "group.json").exists():
        return None
    code, text = explain(slurm_cluster, tmp_path, shared, "--json")
    if code != 0:
        return None
    found: dict[str, Any] = json.loads(text[: text.rindex("}") + 1])
    return found


def straggler_named(slurm_cluster: SlurmCluster, tmp_path: Path, shared: Path) -> dict[str, Any] | None:
    found = (group_json(slurm_cluster, tmp_path, shared) or {}).get("straggler")
    return found if found and found["rank"] == 1 else None


def test_explain_group_names_a_slow_rank_on_another_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    rendezvous = (
        f"export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0 MASTER_ADDR=127.0.0.1"
        f" MASTER_PORT={free_port()} GLOO_SOCKET_IFNAME=lo TMPDIR={tmp_path};"
    )
    run = (
        f"{node_home(tmp_path)} {rendezvous} exec {JW} run --group-dir {shared}"
        f" -- {sys.executable} {JOB} sleep-after 1 {tmp_path / 'slow'}"
    )
    srun = slurm_cluster.srun_async("-N", "2", "-n", "2", "--ntasks-per-node=1", "bash", "-c", run)
    try:

        def compared_alike() -> dict[str, Any] | None:
            if srun.poll() is not None:
                pytest.fail(f"the job ended before its ranks were compared: {srun.communicate()}")
            group = group_json(slurm_cluster, tmp_path, shared) or {}
            if group.get("straggler") is not None:
                pytest.fail(f"a straggler named among ranks that run alike: {group['straggler']}")
            views = group.get("rank_views") or {}
            return views if (views.get("judged"), views.get("nodes_compared")) == (2, ["n1", "n2"]) else None

        began = time.monotonic()
        alike = eventually("both ranks compared, alike", compared_alike, COMPARED_WITHIN_S, every_s=2.0)
        switched = time.monotonic()
        (tmp_path / "slow").touch()  # rank 1 sleeps in each step from now on

        def named() -> dict[str, Any] | None:
            if srun.poll() is not None:
                pytest.fail(f"the job ended before a straggler was named: {srun.communicate()}")
            return straggler_named(slurm_cluster, tmp_path, shared)

        found = eventually("explain --group naming rank 1 the straggler", named, NAMED_WITHIN_S, every_s=2.0)
        print(
            f"across nodes: compared alike {switched - began:.1f} s after srun began, "
            f"straggler named {time.monotonic() - switched:.1f} s after the switch"
        )
        _, text = explain(slurm_cluster, tmp_path, shared)
    finally:
        group = shared / "attempt-0" / "group.json"
        if group.exists():
            slurm_cluster.scancel(json.loads(group.read_text())["slurm_job_id"])
        try:
            srun.communicate(timeout=60)
        finally:
            if srun.poll() is None:
                srun.kill()
                srun.communicate()
    first, started = (
        json.loads((shared / "attempt-0" / "ranks" / f"rank-{r}.jsonl").read_text().splitlines()[0])
        for r in (0, 1)
    )
    assert (started["kind"], {first["node"], started["node"]}) == ("started", {"n1", "n2"}), started
    slow_node = started["node"]  # one task per node: rank 1's is not rank 0's
    assert (found["node"], found["pid"], found["nodes_compared"]) == (slow_node, started["pid"], 2), found
    assert found["title"].startswith("Rank 1 is a straggler: "), found
    assert found["title"].endswith("× slower per step than the others"), found
    assert "slept in" in found["summary"] and "clock_nanosleep" in found["summary"], found
    line = next((t for t in text.splitlines() if "[straggler]" in t), "")
    assert line.startswith(
        f"  rank 1 on node {slow_node} (pid {started['pid']}) [straggler]: Rank 1 is a straggler"
    ), text
    # each node published only its own rank
    views = sorted(p.name for p in (shared / "attempt-0" / "rankviews").iterdir())
    assert views == ["n1.json", "n2.json"], views
    for node, rank in ((first["node"], 0), (slow_node, 1)):
        doc = json.loads((shared / "attempt-0" / "rankviews" / f"{node}.json").read_text())
        assert [r["rank"] for r in doc["ranks"]] == [rank], doc
    assert alike["ranks"] == 2 and alike["job_ended"] is None, alike
    # after the end: the last views still name it, and say they are the last, with their span
    after = group_json(slurm_cluster, tmp_path, shared)
    assert after is not None and after["state"] != "running", after
    assert after["straggler"]["rank"] == 1 and after["rank_views"]["job_ended"], after
    _, text = explain(slurm_cluster, tmp_path, shared)
    line = next((t for t in text.splitlines() if "[straggler]" in t), "")
    assert "(in the last views before the job ended at " in line, text

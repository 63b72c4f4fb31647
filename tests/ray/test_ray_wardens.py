"""jobwarden.ray on a real two-raylet Ray: one warden actor per node runs the node's rank under an
attached `jobwarden run`; a failing rank fails the whole run with its node's verdict, and a killed driver
takes every rank with it, each run ended as an engine stop, never lost."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_fifo, read_fifo
from tests.ray.conftest import TIMINGS
from tests.ray.raycluster import RayNamespace
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(600)]

RANK = Path(__file__).with_name("jobs") / "rank.py"
ALLREDUCE = Path(__file__).with_name("jobs") / "allreduce.py"
DRIVER = Path(__file__).with_name("driver.py")


def marked(mark: str) -> list[int]:
    """Live processes (host pids) whose environment carries the test's mark: wardens' CLIs, shims, ranks."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if f"RAY_TEST_MARK={mark}".encode() in env and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def spec(tmp: Path, modes: str, ready: Path | None = None) -> dict[str, Any]:
    return {"rank": str(RANK), "modes": modes, "home": str(tmp / "home-{node}"), "mark": uuid.uuid4().hex,
            "ready": str(ready) if ready else None}  # fmt: skip


def driver_report(stdout: str) -> dict[str, Any]:
    [line] = [line for line in stdout.splitlines() if line.startswith("REPORT ")]
    return dict(json.loads(line.removeprefix("REPORT ")))


def node_run(ns: RayNamespace, home: Path) -> dict[str, Any]:
    """The one run in a node's home (job 1), read inside the namespace: its pids are the namespace's."""
    done = ns.run("jobwarden", "status", "--json", "1", env={"JOBWARDEN_HOME": str(home)}, check=True)
    return dict(json.loads(done.stdout))


def test_a_failing_rank_fails_the_run_and_stops_the_other(ray_ns: RayNamespace, tmp_path: Path) -> None:
    """Rank 1 raises once rank 0 is up; rank 0 would wait forever (a peer in a collective): its warden is
    killed a second after the failure, and its jobwarden ends the run as an engine stop."""
    ray_ns.wait_second_node()
    ready = tmp_path / "ready"
    ready.mkdir()
    make_fifo(ready / "ready-0")
    groups = tmp_path / "groups" / "{group}"  # shared by the two "nodes", as a cluster's shared file system
    job = {**spec(tmp_path, "hang,raise-after-0", ready), "stop_others_after_s": 1, "group_dir": str(groups)}
    began = time.monotonic()
    done = ray_ns.run(sys.executable, str(DRIVER), json.dumps(job), timeout=300, check=True)
    TIMINGS["two-node wardens run, driver start to results (s)"] = time.monotonic() - began
    report = driver_report(done.stdout)
    stopped, failed = report["results"]
    assert (failed["node_rank"], failed["exit_code"]) == (1, 1), report
    assert [f["rule"] for f in failed["verdict"]["findings"]][:1] == ["python-exception"], failed["verdict"]
    assert (stopped["node_rank"], stopped["exit_code"]) == (0, None), report
    assert stopped["error"] == "stopped 1 s after node 1 failed", report
    assert [f["rule"] for f in stopped["verdict"]["findings"]][:1] == ["cancelled-by-engine"], stopped
    assert stopped["node"] != failed["node"], (
        "both wardens on one node: NodeAffinitySchedulingStrategy ignored"
    )
    assert report["error"].startswith("2 of 2 nodes failed: node 0 ("), report["error"]
    assert "node 1 (" in report["error"] and "python-exception" in report["error"]
    homes = sorted(tmp_path.glob("home-*"))
    assert [h.name for h in homes] == sorted(f"home-{r['node']}" for r in (stopped, failed))  # node-local
    assert marked(job["mark"]) == []
    group = report["group"]  # one verdict: rank 1's exception is the root, rank 0 was stopped for it
    assert (group["root_cause"]["rank"], group["root_cause"]["rule"]) == (1, "python-exception"), group
    assert {r["rank"]: r["role"] for r in group["ranks"]} == {0: "collateral", 1: "root"}, group
    assert [p.name for p in (tmp_path / "groups").iterdir()] == [group["group"]]


def test_torchrun_on_two_nodes_as_the_readme_runs_it(ray_ns: RayNamespace, tmp_path: Path) -> None:
    """torchrun gets --nnodes, --node-rank and --master-addr from the wardens (PET_*); its workers' RANK
    names the ranks in the group records."""
    ray_ns.wait_second_node()
    command = ["torchrun", "--nproc-per-node=1", "--master-port=29500", str(ALLREDUCE)]
    job = {**spec(tmp_path, "-"), "command": command, "rank_per_node": False}
    job["group_dir"] = str(tmp_path / "groups" / "{group}")
    began = time.monotonic()
    done = ray_ns.run(sys.executable, str(DRIVER), json.dumps(job), timeout=300, check=True)
    TIMINGS["torchrun on two nodes, driver start to results (s)"] = time.monotonic() - began
    report = driver_report(done.stdout)
    assert [(r["node_rank"], r["exit_code"]) for r in report["results"]] == [(0, 0), (1, 0)], report
    for result in report["results"]:  # each node's output, in its node-local home
        log = (tmp_path / f"home-{result['node']}" / "jobs" / "1" / "run-1" / "output.log").read_text()
        assert f"rank {result['node_rank']} of 2: sum 3.0" in log, log
    group = report["group"]
    assert (group["state"], [r["rank"] for r in group["ranks"]]) == ("succeeded", [0, 1]), group
    assert marked(job["mark"]) == []


def test_a_killed_driver_leaves_no_rank_running(ray_ns: RayNamespace, tmp_path: Path) -> None:
    ray_ns.wait_second_node()
    ready = tmp_path / "ready"
    ready.mkdir()
    for rank in (0, 1):
        make_fifo(ready / f"ready-{rank}")
    job = spec(tmp_path, "hang", ready)
    driver = ray_ns.popen(sys.executable, str(DRIVER), json.dumps(job))
    try:
        for rank in (0, 1):
            read_fifo(ready / f"ready-{rank}", timeout_s=180)
        assert len(marked(job["mark"])) >= 6  # per node: the attached CLI, its shim, the rank
        # nsenter's child is the driver inside the namespace
        [inside] = Path(f"/proc/{driver.pid}/task/{driver.pid}/children").read_text().split()
        killed_at = time.monotonic()
        os.kill(int(inside), signal.SIGKILL)
        # the kernel has no event for "no such process left": poll
        eventually("no rank left after the driver died", lambda: not marked(job["mark"]), 60, every_s=0.1)
        TIMINGS["driver SIGKILLed -> no rank left (s)"] = time.monotonic() - killed_at
    finally:
        driver.kill()
        driver.communicate()
    for home in tmp_path.glob("home-*"):
        run = node_run(ray_ns, home)
        assert run["state"] != "lost", run
        assert run["end_reason"] == "engine-stop", run
        assert [f["rule"] for f in run["findings"]][:1] == ["cancelled-by-engine"], run["findings"]

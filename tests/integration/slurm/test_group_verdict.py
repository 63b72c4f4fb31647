"""The group verdict and the requeue contract (issue 12, parts 3-5) on the session's throwaway Slurm
(conftest.py): two nodes n1 and n2, each with its own JOBWARDEN_HOME (as two machines have), one shared
group directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
JW = f"{sys.executable} -m jobwarden"
# rank 1 allocates past Slurm's --mem; rank 0 waits at a barrier its peer never reaches
RANK = """
import os, pathlib, sys, time
rank = int(os.environ["SLURM_PROCID"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    keep = []
    while True:
        keep.append(b"x" * (1 << 20))
        time.sleep(0.005)
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.2)
"""


def node_home(tmp_path: Path) -> str:
    """Each node's own home, as on a cluster whose nodes keep their stores on local disk."""
    return f"export JOBWARDEN_HOME={tmp_path}/nodes/$SLURMD_NODENAME NO_COLOR=1;"


def explain(slurm_cluster: SlurmCluster, tmp_path: Path, group_dir: Path, *args: str) -> tuple[int, str]:
    group = json.loads((group_dir / "attempt-0" / "group.json").read_text())["group"]
    done = slurm_cluster.command(
        sys.executable,
        "-m",
        "jobwarden",
        "explain",
        "--group",
        group,
        "--group-dir",
        str(group_dir),
        *args,
        env={"JOBWARDEN_HOME": str(tmp_path / "nodes" / "n1")},
    )
    return done.returncode, done.stdout + done.stderr


def test_an_oom_on_one_node_is_the_root_and_the_hung_rank_on_the_other_collateral(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "rank.py").write_text(RANK)
    shared = tmp_path / "shared"
    run = (
        f"{node_home(tmp_path)} exec {JW} run --hang-timeout 3s --on-hang stop --grace 1s"
        f" --group-dir {shared} --requeue-exit 200 -- {sys.executable} {tmp_path}/rank.py {tmp_path}/never"
    )
    done = slurm_cluster.srun("-N", "2", "-n", "2", "--mem=150M", "bash", "-c", run)
    assert "task 1: Out Of Memory" in done.stderr, done.stderr
    assert done.returncode != 200  # an OOM is never retryable, and the collateral rank never asks either
    job_id = json.loads((shared / "attempt-0" / "group.json").read_text())["slurm_job_id"]
    assert slurm_cluster.wait_job(int(job_id))["JobState"] == "OUT_OF_MEMORY"  # Slurm still sees the OOM
    code, text = explain(slurm_cluster, tmp_path, shared, "--json", "--exit-status")
    verdict = json.loads(text[: text.rindex("}") + 1])
    assert code == 1
    assert (verdict["root_cause"]["rank"], verdict["root_cause"]["node"]) == (1, "n2")
    assert verdict["root_cause"]["rule"] == "oom-kill"
    assert {(r["rank"], r["node"], r["role"]) for r in verdict["ranks"]} == {
        (0, "n1", "collateral"),
        (1, "n2", "root"),
    }
    assert verdict["missing_nodes"] == []
    _, line = explain(slurm_cluster, tmp_path, shared)
    assert line.startswith("rank 1 on node n2 was OOM-killed at ") and "rank 0 then hung: collateral" in line


def test_a_retryable_end_requeues_the_job_with_the_next_attempt(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The task kills itself (SIGKILL, no OOM): killed from outside, retryable; Slurm's RequeueExit=200
    requeues it; the second attempt (SLURM_RESTART_COUNT=1) is past --max-requeues 1 and ends as it is."""
    shared = tmp_path / "shared"
    script = (
        f"#!/bin/bash\n{node_home(tmp_path)}\n"
        f"srun {JW} run --group-dir {shared} --requeue-exit 200 --max-requeues 1 -- sh -c 'kill -9 $$'\n"
        "exit $?\n"
    )
    job_id = slurm_cluster.sbatch(
        script, "-N", "1", "--requeue", "--open-mode=append", "-o", str(tmp_path / "out.txt")
    )
    first = slurm_cluster.wait_job(job_id, timeout_s=120)
    assert first["ExitCode"].startswith("200"), first
    last = slurm_cluster.wait_job(job_id, timeout_s=120, ends=2)
    assert last["ExitCode"].startswith("137"), last  # 128 + SIGKILL: no requeue code past --max-requeues
    assert sorted(p.name for p in shared.iterdir()) == ["attempt-0", "attempt-1"]
    for attempt, code in ((0, 200), (1, 1)):
        got, _ = explain(slurm_cluster, tmp_path, shared, "--attempt", str(attempt), "--exit-status")
        assert got == code
    # srun's one task is rank 0 as far as Slurm says (SLURM_PROCID): no launcher's RANK says otherwise
    started = json.loads((shared / "attempt-1" / "ranks" / "task-0.jsonl").read_text().splitlines()[0])
    assert (started["kind"], started["attempt"], started["rank"]) == ("started", 1, 0)


def test_a_missing_group_dir_never_breaks_a_slurm_task(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = f"{sys.executable} -c 'print(42)'"
    run = f"{node_home(tmp_path)} exec {JW} run --group-dir /proc/jobwarden-none -- {job}"
    done = slurm_cluster.srun("-N", "1", "bash", "-c", run)
    assert (done.returncode, done.stdout.strip()) == (0, "42"), done.stderr


# research §1.4: one jobwarden per node runs a torchrun-like launcher of 2 ranks (RANK = 2 * node + local);
# rank 3 allocates past --mem at once; its launcher SIGTERMs rank 2 and exits 1; the ranks on the other
# node wait in all_reduce (a stand-in torch/distributed/distributed_c10d.py, so their stacks look like
# torch's) until the watchdog judges them hung and stops them
LAUNCHER = """
import os, signal, subprocess, sys
node = int(os.environ["SLURM_NODEID"])
procs = [subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]],
                          env={**os.environ, "RANK": str(2 * node + local), "LOCAL_RANK": str(local)})
         for local in range(2)]
pid, status = os.wait()
if status != 0:
    for p in procs:
        if p.pid != pid and p.poll() is None:
            p.send_signal(signal.SIGTERM)
for p in procs:
    p.wait()
sys.exit(1 if status else 0)
"""
TRAIN = """
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch.distributed.distributed_c10d import all_reduce
rank = int(os.environ["RANK"])
print(f"rank {rank} step 1", flush=True)
if rank == 3:
    keep = []
    while True:
        keep.append(b"x" * (1 << 20))
        time.sleep(0.005)
all_reduce(sys.argv[1])
"""
C10D = """
import pathlib, time
def all_reduce(barrier):
    while not pathlib.Path(barrier).exists():
        time.sleep(0.2)
"""


def test_one_jobwarden_per_node_the_oom_rank_is_root_and_the_rest_collateral(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    (tmp_path / "train.py").write_text(TRAIN)
    c10d = tmp_path / "torch" / "distributed"
    c10d.mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text("")
    (c10d / "__init__.py").write_text("")
    (c10d / "distributed_c10d.py").write_text(C10D)
    shared = tmp_path / "shared"
    run = (
        f"{node_home(tmp_path)} exec {JW} run --hang-timeout 3s --on-hang stop --grace 1s"
        f" --group-dir {shared} -- {sys.executable} {tmp_path / 'launcher.py'}"
        f" {tmp_path / 'train.py'} {tmp_path / 'never'}"
    )
    done = slurm_cluster.srun("-N", "2", "--ntasks-per-node=1", "--mem=200M", "bash", "-c", run)
    assert done.returncode == 1, done.stderr
    # each worker its own file; the tasks' files hold what came before the workers appeared
    ranks = sorted(p.name for p in (shared / "attempt-0" / "ranks").iterdir())
    assert ranks == [
        "rank-0.jsonl",
        "rank-1.jsonl",
        "rank-2.jsonl",
        "rank-3.jsonl",
        "task-0.jsonl",
        "task-1.jsonl",
    ]
    code, text = explain(slurm_cluster, tmp_path, shared, "--json", "--exit-status")
    verdict = json.loads(text[: text.rindex("}") + 1])
    assert code == 1
    assert (verdict["root_cause"]["rank"], verdict["root_cause"]["node"]) == (3, "n2")
    assert verdict["root_cause"]["rule"] == "oom-kill"
    roles = {(r["rank"], r["node"]): r["role"] for r in verdict["ranks"]}
    assert roles == {
        (0, "n1"): "collateral",
        (1, "n1"): "collateral",
        (2, "n2"): "collateral",
        (3, "n2"): "root",
    }
    _, line = explain(slurm_cluster, tmp_path, shared)
    assert line.startswith("rank 3 on node n2 was OOM-killed at "), line
    assert "ranks 0, 1 then hung" in line, line

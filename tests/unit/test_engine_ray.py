"""Ray as an engine: found from what Ray sets for a Jobs entrypoint or a worker, its submission id names
the group, its stop wait is the budget; and jobwarden.ray's command lines, without a cluster (the real
thing runs in tests/ray)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobwarden.control.engine import detect_engine, engine_place, ray_submission_id
from jobwarden.control.options import engine_options
from jobwarden.errors import UsageError
from jobwarden.ray.warden import NodeResult, NodesFailed, _argv, _env

# what Ray 2.60 put in an entrypoint's environment (measured: docs/cluster.md)
ENTRYPOINT = {
    "RAY_ADDRESS": "127.0.0.1:6379",
    "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(
        {"runtime_env": {"env_vars": {}}, "metadata": {"job_submission_id": "raysubmit_7Tz", "job_name": "x"}}
    ),
    "RAY_JOB_STOP_WAIT_TIME_S": "8",
}
WORKER = {"RAY_RAYLET_PID": "407", "RAY_JOB_ID": "02000000"}  # an actor's (a warden's)


def test_ray_is_found_in_an_entrypoint_and_a_worker_but_not_by_its_address() -> None:
    assert detect_engine("auto", ENTRYPOINT) == "ray"
    assert detect_engine("auto", WORKER) == "ray"
    assert detect_engine("auto", {"RAY_ADDRESS": "http://127.0.0.1:8265"}) is None  # a user's own setting
    assert detect_engine("auto", {**ENTRYPOINT, "SLURM_JOB_ID": "9"}) == "slurm"  # Ray started inside Slurm
    assert detect_engine("none", ENTRYPOINT) is None


def test_the_submission_id_names_the_group_and_odd_json_names_none() -> None:
    assert ray_submission_id(ENTRYPOINT) == "raysubmit_7Tz"
    assert engine_place("ray", ENTRYPOINT) == ("ray", "ray-raysubmit_7Tz", 0, None, None)
    assert engine_place("ray", WORKER).group is None  # a warden passes --group
    for odd in ("not json", "[1]", '{"metadata": 3}', ""):
        assert ray_submission_id({"RAY_JOB_CONFIG_JSON_ENV_VAR": odd}) is None


def test_an_entrypoint_runs_attached_in_its_group_on_the_node_given() -> None:
    options = engine_options(ENTRYPOINT, node="n7")
    assert (options["engine"], options["group"], options["node"]) == ("ray", "ray-raysubmit_7Tz", "n7")
    assert engine_options(ENTRYPOINT, detach=True)["engine"] is None


@pytest.mark.parametrize("node", ["", "a/b", "..", "n\n1"])
def test_a_bad_node_is_one_line_naming_the_flag(node: str) -> None:
    with pytest.raises(UsageError, match=r"^--node"):
        engine_options({}, node=node)


def test_a_warden_runs_jobwarden_attached_with_its_node_and_home() -> None:
    argv = _argv(["python", "train.py"], "ray-j1", "abc123", 1, None, "/shared/g", ("--grace", "5s"), True)
    assert argv[1:] == [
        *("-m", "jobwarden", "run", "--engine", "ray", "--group", "ray-j1", "--node", "abc123"),
        *("--name", "ray-j1-n1", "--rank", "1", "--group-dir", "/shared/g", "--grace", "5s"),
        *("--", "python", "train.py"),
    ]
    env = _env({"A": "1"}, 1, 2, "10.0.0.1", "/local/{node}/jw", "abc123")
    assert env == {
        "A": "1",
        "NODE_RANK": "1",
        "NNODES": "2",
        "MASTER_ADDR": "10.0.0.1",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "10.0.0.1",
        "JOBWARDEN_HOME": "/local/abc123/jw",
    }


def test_a_failure_names_each_failed_node_with_its_finding() -> None:
    verdict = {"findings": [{"rule": "python-exception", "title": "ValueError: rank 1 failed"}]}
    stopped = {"findings": [{"rule": "cancelled-by-engine", "title": "x"}]}
    results = [
        NodeResult(0, "a" * 56, "10.0.0.1", 0, {"findings": []}),
        NodeResult(1, "b" * 56, "10.0.0.2", 1, verdict),
        NodeResult(2, "c" * 56, "10.0.0.3", None, None, "ActorDiedError: the node died"),
        NodeResult(3, "d" * 56, "10.0.0.4", None, stopped, "stopped 30 s after node 1 failed"),
    ]
    parts = str(NodesFailed(results)).split("; ")
    assert parts == [
        "3 of 4 nodes failed: node 1 (bbbbbbbbbbbb at 10.0.0.2): exit 1: python-exception: ValueError: "
        "rank 1 failed",
        "node 2 (cccccccccccc at 10.0.0.3): ActorDiedError: the node died",
        "node 3 (dddddddddddd at 10.0.0.4): stopped 30 s after node 1 failed: cancelled-by-engine: x",
    ]


def test_importing_the_helper_imports_no_ray() -> None:
    code = "import sys, jobwarden.ray; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

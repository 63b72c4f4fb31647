"""GPU claims are atomic between processes: real processes, each with its own store connection, race
`try_admit` over the same fake NVML state; exactly one wins each GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobwarden.model import JobSpec, JobState
from jobwarden.probes import fakenvml
from jobwarden.store import Store

pytestmark = pytest.mark.integration

NOW = 1_700_000_000.0
RACERS = 6

# Each racer opens the store and the probe, waits on the shared pipe (so all start at once), then asks
# for its GPUs once and prints the answer.
RACER = """
import json, os, sys
from jobwarden.shim.admission.gpus import describe_wait, try_admit
from jobwarden.probes.gpu import open_gpu_probe
from jobwarden.store import Store
from pathlib import Path

home, job, gate, request = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
with Store(Path(home)) as store, open_gpu_probe() as probe:
    store.gpu_claims()  # connected and migrated before the start
    os.read(gate, 1)
    admission = try_admit(store, job, 1, probe, **request, now=0.0)
    print(json.dumps({"job": job, "claimed": admission.claimed, "line": describe_wait(admission)}))
"""


def race(tmp_path: Path, request: dict[str, Any], gpus: int) -> list[dict[str, Any]]:
    home, state = tmp_path / "home", tmp_path / "nvml.json"
    fakenvml.write_state(state, {"devices": [fakenvml.device(i) for i in range(gpus)]})
    with Store(home) as store:
        spec = JobSpec(command=("python", "t.py"), cwd="/", name="racer")
        jobs = [store.create_job(spec, {}, NOW, JobState.QUEUED)[0] for _ in range(RACERS)]
    gate_r, gate_w = os.pipe()
    env = {**os.environ, fakenvml.FAKE_NVML_ENV: str(state)}
    racers = []
    try:
        for job in jobs:
            argv = [sys.executable, "-c", RACER, str(home), str(job), str(gate_r), json.dumps(request)]
            racers.append(
                subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, pass_fds=(gate_r,))
            )
        os.write(gate_w, b"x" * RACERS)  # open the gate for all of them at once
        results = []
        for racer in racers:
            out, _ = racer.communicate(timeout=90)
            assert racer.returncode == 0
            results.append(json.loads(out))
    finally:
        os.close(gate_r)
        os.close(gate_w)
        for racer in racers:
            racer.kill()
            racer.wait()
            if racer.stdout:
                racer.stdout.close()
    with Store(home) as store:
        claims = store.gpu_claims()
    won = {i: r["job"] for r in results for i in r["claimed"]}
    assert claims == {i: (job, 1) for i, job in won.items()}  # what they were told is what is recorded
    return results


def test_racing_runs_each_get_a_different_gpu(tmp_path: Path) -> None:
    results = race(tmp_path, {"count": 1}, gpus=2)
    winners = [r for r in results if r["claimed"]]
    assert sorted(i for r in winners for i in r["claimed"]) == [0, 1]
    losers = [r for r in results if not r["claimed"]]
    assert len(losers) == RACERS - 2
    for loser in losers:
        assert loser["line"].startswith("waiting for 1 free GPU: GPU 0 claimed by job ")
        assert "; GPU 1 claimed by job " in loser["line"]


def test_racing_runs_pinned_to_one_gpu_let_exactly_one_through(tmp_path: Path) -> None:
    results = race(tmp_path, {"ids": [1]}, gpus=3)
    (winner,) = [r for r in results if r["claimed"]]
    assert winner["claimed"] == [1]
    for loser in (r for r in results if not r["claimed"]):
        assert loser["line"] == f"waiting for GPU 1: GPU 1 claimed by job {winner['job']} (racer) run 1"


def test_racing_runs_never_split_a_multi_gpu_request(tmp_path: Path) -> None:
    results = race(tmp_path, {"count": 2}, gpus=3)
    (winner,) = [r for r in results if r["claimed"]]  # 3 GPUs: room for one pair only
    assert len(winner["claimed"]) == 2


def test_test_jobs_taking_gpus_at_once_lose_no_update(tmp_path: Path) -> None:
    state = tmp_path / "nvml.json"
    fakenvml.write_state(state, {"devices": [fakenvml.device(0)]})
    env = {**os.environ, fakenvml.FAKE_NVML_ENV: str(state)}
    holders = [
        subprocess.Popen(
            [sys.executable, "-m", "jobwarden.probes.fakenvml", "hold", "0", str(1 << 30), "--pid", str(pid)],
            env=env,
        )
        for pid in range(100, 108)
    ]
    for holder in holders:
        assert holder.wait(timeout=90) == 0
    listed = json.loads(state.read_text())["devices"][0]["compute"]
    assert sorted(p["pid"] for p in listed) == list(range(100, 108))

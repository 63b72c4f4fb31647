"""jobwarden as the entrypoint of Ray Jobs, on a real Ray head: Ray sees the job's own status and output,
and `ray job stop` ends the run inside Ray's stop wait with its end recorded, nothing left running."""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from jobwarden.store import Store
from tests.conftest import make_fifo, processes_under, read_fifo
from tests.ray.conftest import TIMINGS
from tests.ray.raycluster import STOP_WAIT_S, RayNamespace
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(600)]

RANK = Path(__file__).with_name("jobs") / "rank.py"
JOBSCTL = Path(__file__).with_name("jobsctl.py")


def entrypoint(home: Path, *args: str) -> str:
    """What a user types after `ray job submit --`; plain words only (Ray rejoins them for a shell). The
    home is set on the command line, not in Ray's runtime env: that one also reaches Ray's own helper
    processes of the job (its supervisor's watcher), which must not count as the job's."""
    return " ".join([f"JOBWARDEN_HOME={home}", "jobwarden", "run", *args])


def jobsctl(ns: RayNamespace, spec: dict[str, Any]) -> list[dict[str, Any]]:
    done = ns.run(sys.executable, str(JOBSCTL), json.dumps(spec), timeout=300, check=True)
    return list(json.loads(done.stdout.splitlines()[-1]))


def explain(ns: RayNamespace, home: Path, name: str) -> dict[str, Any]:
    """Read inside the namespace: the run's pids are the namespace's."""
    done = ns.run("jobwarden", "status", "--json", name, env={"JOBWARDEN_HOME": str(home)}, check=True)
    return dict(json.loads(done.stdout))


def test_ray_sees_the_jobs_own_status_and_output(ray_ns: RayNamespace, tmp_path: Path) -> None:
    home, mark = tmp_path / "home", uuid.uuid4().hex
    env = {"RAY_TEST_MARK": mark}
    jobs = {  # no --engine: Ray is found by what Ray Jobs sets for its entrypoint
        f"fails-{mark[:8]}": entrypoint(home, "--name", "fails", "--", "python", str(RANK), "exit:3"),
        f"works-{mark[:8]}": entrypoint(home, "--name", "works", "--", "python", str(RANK), "exit:0"),
    }
    began = time.monotonic()
    submit = [{"id": job_id, "entrypoint": line, "env": env} for job_id, line in jobs.items()]
    failed, succeeded = jobsctl(ray_ns, {"submit": submit, "wait": list(jobs)})
    TIMINGS["two entrypoint jobs, submitted to done (s)"] = time.monotonic() - began

    assert (failed["status"], failed["driver_exit_code"]) == ("FAILED", 3), failed
    assert (succeeded["status"], succeeded["driver_exit_code"]) == ("SUCCEEDED", 0), succeeded
    for job in (failed, succeeded):  # the job's output, tailed by `jobwarden run` into Ray's job log
        assert f"rank 0 up: exit:{job['driver_exit_code']}, marker {mark}" in job["logs"], job["logs"]
    assert explain(ray_ns, home, "fails")["exit_code"] == 3
    assert explain(ray_ns, home, "works")["state"] == "succeeded"
    assert processes_under(home) == []
    with Store(home) as store:
        options = [store.job(name).options for name in ("fails", "works")]
    assert [(o.engine, o.group) for o in options] == [("ray", f"ray-{job_id}") for job_id in jobs]


@pytest.mark.parametrize("mode", ["hang", "stubborn"])
def test_ray_job_stop_ends_the_run_inside_the_stop_wait(
    ray_ns: RayNamespace, tmp_path: Path, mode: str
) -> None:
    """Ray SIGTERMs the CLI, the shim and the job at once; a job that ignores it is SIGKILLed by the shim
    before Ray's stop wait runs out (its default grace, 10 s, would not fit in the 8 s wait)."""
    home, ready = tmp_path / "home", tmp_path / "ready"
    ready.mkdir()
    make_fifo(ready / "ready-0")
    job_id = f"stopped-{uuid.uuid4().hex[:8]}"
    line = entrypoint(
        home, "--engine", "ray", "--name", "stopped", "--", "python", str(RANK), mode, str(ready)
    )
    ray_ns.run(
        "ray", "job", "submit", "--no-wait", f"--submission-id={job_id}", "--", *line.split(), check=True
    )
    read_fifo(ready / "ready-0", timeout_s=180)

    stop_at = time.time()
    ray_ns.run("ray", "job", "stop", job_id, check=True)  # returns once Ray counts the job STOPPED
    [report] = jobsctl(ray_ns, {"wait": [job_id]})
    assert report["status"] == "STOPPED", report
    if mode == "hang":
        assert "SIGTERM, saving a checkpoint" in report["logs"], report["logs"]
    supervisor_log = next((ray_ns.tmp / "ray").glob(f"session_*/logs/jobs/supervisor-{job_id}.log"))
    assert "terminated gracefully" in supervisor_log.read_text(), "Ray had to SIGKILL: the stop wait ran out"

    run = explain(ray_ns, home, "stopped")
    assert run["state"] != "lost", run
    assert run["end_reason"] == "engine-stop", run
    assert [f["rule"] for f in run["findings"]][:1] == ["cancelled-by-engine"], run["findings"]
    assert processes_under(home) == []
    with Store(home) as store:
        events = store.events(int(run["id"]))
    signalled = min(e.at for e in events if e.kind == "engine-signal")
    ended = datetime.fromisoformat(run["ended_at"]).timestamp()
    TIMINGS[f"{mode} job: ray job stop -> end recorded (s)"] = ended - stop_at
    TIMINGS[f"{mode} job: engine signal -> end recorded (s)"] = ended - signalled
    assert ended - signalled < STOP_WAIT_S


def test_a_killed_job_supervisor_leaves_nothing_running(ray_ns: RayNamespace, tmp_path: Path) -> None:
    """Ray's supervisor actor of a job dies (killed here, or crashed): Ray kills the entrypoint's shell
    but signals nothing else, and its own clean-up misses the rest. The attached run dies with its parent
    and ends as an engine stop."""
    home, ready = tmp_path / "home", tmp_path / "ready"
    ready.mkdir()
    make_fifo(ready / "ready-0")
    job_id = f"orphaned-{uuid.uuid4().hex[:8]}"
    line = entrypoint(home, "--name", "orphaned", "--", "python", str(RANK), "hang", str(ready))
    ray_ns.run(
        "ray", "job", "submit", "--no-wait", f"--submission-id={job_id}", "--", *line.split(), check=True
    )
    read_fifo(ready / "ready-0", timeout_s=180)
    supervisor = f"'_ray_internal_job_actor_{job_id}', namespace='SUPERVISOR_ACTOR_RAY_NAMESPACE'"
    kill = f"import ray; ray.init(address='127.0.0.1:6379'); ray.kill(ray.get_actor({supervisor}))"
    ray_ns.run(sys.executable, "-c", kill, check=True)
    # the kernel has no event for "no such process left": poll
    eventually(
        "the job ended after Ray's supervisor died", lambda: not processes_under(home), 60, every_s=0.1
    )
    run = explain(ray_ns, home, "orphaned")
    assert (run["state"], run["end_reason"]) == ("stopped", "engine-stop"), run
    assert [f["rule"] for f in run["findings"]][:1] == ["cancelled-by-engine"], run["findings"]

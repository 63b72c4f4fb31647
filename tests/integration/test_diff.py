"""`jobwarden diff` and what changed since a success, with the real CLI and real shims: each run's
fingerprint is taken at its launch with no change to the job, and two runs that differ by a package
version, a git commit or an --env key say so; identical runs say nothing changed; a failure after a
success cites what changed in `explain`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from jobwarden.model import JobSpec, JobState
from jobwarden.probes import fakenvml
from jobwarden.store import Store
from tests.conftest import Jobwarden
from tests.integration.webtools import Client, web_server
from tests.unit.test_fingerprint import git

pytestmark = pytest.mark.integration
# exits with the number in ./code (0 when there is none): one command that succeeds, then fails
EXIT_AS_TOLD = "import os, sys; sys.exit(int(open('code').read()) if os.path.exists('code') else 0)"


def packages(tmp_path: Path, version: str) -> Path:
    """A directory for PYTHONPATH holding one distribution, fakepkg, at `version`."""
    directory = tmp_path / f"site-{version}"
    info = directory / f"fakepkg-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakepkg\nVersion: {version}\n\n")
    return directory


def run(jw: Jobwarden, cwd: Path, *options: str, code: int = 0) -> int:
    """The same command in `cwd`, run to its end; returns the job's id."""
    ran = jw("run", "--wait", "--cwd", str(cwd), *options, "--", sys.executable, "-c", EXIT_AS_TOLD)
    assert ran.returncode == code, ran.stderr
    return int(ran.stdout.split()[0])


def diff_lines(jw: Jobwarden, *args: str) -> list[str]:
    out = jw("diff", *args, check=True).stdout.splitlines()
    assert out[0].endswith(":")  # which runs, from the earlier to the later
    return out[1:]


def test_a_package_version_is_what_changed(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    first = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '1.0')}")
    second = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '2.0')}")
    assert diff_lines(jw, str(second)) == ["package fakepkg 1.0 -> 2.0"]  # against the last success
    assert diff_lines(jw, str(first), str(second)) == ["package fakepkg 1.0 -> 2.0"]
    assert diff_lines(jw, str(second), str(first)) == ["package fakepkg 1.0 -> 2.0"]  # earlier to later


def test_identical_runs_say_nothing_changed(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    run(jw, work, "--env", "WANDB_MODE=offline")
    second = run(jw, work, "--env", "WANDB_MODE=online")  # a value is no change: only keys are kept
    assert diff_lines(jw, str(second)) == ["nothing changed"]
    assert jw.json("diff", str(second))["changes"] == []


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_new_commit_and_a_dirty_tree(jw: Jobwarden, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("lr = 3e-4\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-q", "-m", "one")
    first = run(jw, repo)
    (repo / "train.py").write_text("lr = 1e-3\n")
    git(repo, "commit", "-q", "-am", "two")
    second = run(jw, repo)
    [change] = diff_lines(jw, str(second))
    one, two = (jw.json("diff", str(first), str(second))["changes"][0][k] for k in ("before", "after"))
    assert change == f"git commit {one[:7]} -> {two[:7]}" and len(one) == len(two) == 40
    (repo / "train.py").write_text("lr = 1e-2\n")  # not committed
    third = run(jw, repo)
    assert diff_lines(jw, str(third)) == [f"git commit {two[:7]} -> {two[:7]} (dirty)"]
    fourth = run(jw, repo)
    assert diff_lines(jw, str(fourth)) == ["nothing changed"]  # the same uncommitted change
    (repo / "train.py").write_text("lr = 5e-3\n")
    [dirty] = diff_lines(jw, str(run(jw, repo)))
    assert dirty.startswith("git diff (uncommitted) ")
    assert "1e-2" not in json.dumps(jw.json("diff", str(fourth)))  # the diff is hashed, never kept


def test_an_env_key_added_never_shows_its_value(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    first = run(jw, work)
    second = run(jw, work, "--env", "WANDB_API_KEY=hunter2-secret")
    assert diff_lines(jw, str(second)) == ["env key WANDB_API_KEY added"]
    assert diff_lines(jw, str(second), str(first)) == ["env key WANDB_API_KEY added"]
    answer = jw("diff", str(second), "--json", check=True).stdout
    assert "hunter2" not in answer
    assert "hunter2" not in jw("explain", str(second)).stdout


def test_the_gpus_and_the_driver_as_nvml_says(jw: Jobwarden, tmp_path: Path) -> None:
    """Through the fake NVML (the shim's own GPU watch): a driver upgrade, and the GPUs the job sees."""
    state = tmp_path / "nvml.json"
    gpus = [fakenvml.device(i, name="NVIDIA H100 80GB HBM3") for i in range(2)]
    fakenvml.write_state(
        state, {"devices": gpus, "driver_version": "550.54.15", "cuda_driver_version": 12040}
    )
    jw.env[fakenvml.FAKE_NVML_ENV] = str(state)
    work = tmp_path / "work"
    work.mkdir()
    sleep = (sys.executable, "-c", "import time; time.sleep(0.5)")  # the GPU watch is opened for a live job
    first = jw(
        "run", "--wait", "--cwd", str(work), "--env", "CUDA_VISIBLE_DEVICES=1", "--", *sleep, check=True
    )
    fakenvml.update_state(state, lambda s: s.update(driver_version="555.42.02", cuda_driver_version=12050))
    second = jw(
        "run", "--wait", "--cwd", str(work), "--env", "CUDA_VISIBLE_DEVICES=1", "--", *sleep, check=True
    )
    assert diff_lines(jw, second.stdout.split()[0]) == [
        "nvidia driver 550.54.15 -> 555.42.02",
        "cuda driver 12.4 -> 12.5",
    ]
    with Store(jw.home) as store:
        taken = store.fingerprint(int(first.stdout.split()[0]), 1)
    assert taken is not None and taken.gpus == ("1 NVIDIA H100 80GB HBM3 GPU-fake-000",)


def test_the_json_shape(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    first = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '1.0')}")
    second = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '2.0')}", "--env", "WANDB_MODE=x")
    answer = jw.json("diff", str(second))
    assert set(answer) >= {"a", "b", "changes"}
    assert {k: answer["a"][k] for k in ("id", "run")} == {"id": second, "run": 1}
    assert {k: answer["b"][k] for k in ("id", "run")} == {"id": first, "run": 1}
    assert answer["b"]["state"] == "succeeded"
    assert [{k: c[k] for k in ("what", "before", "after")} for c in answer["changes"]] == [
        {"what": "package fakepkg", "before": "1.0", "after": "2.0"},
        {"what": "env key WANDB_MODE", "before": None, "after": "set"},
    ]
    assert [c["line"] for c in answer["changes"]] == [
        "package fakepkg 1.0 -> 2.0",
        "env key WANDB_MODE added",
    ]


def test_explain_of_a_failure_after_a_success_cites_what_changed(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    good = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '2.12.0')}")
    (work / "code").write_text("3")
    bad = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '2.13.0')}", code=3)
    cited = f"since run 1 of job {good} succeeded: package fakepkg 2.12.0 -> 2.13.0"
    root = jw.json("explain", str(bad))["findings"][0]
    assert root["evidence"][-1] == cited
    assert cited in jw("explain", str(bad), check=True).stdout
    assert cited not in json.dumps(jw.json("explain", str(good)))  # a success cites nothing
    again = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '2.13.0')}", code=3)
    assert jw.json("explain", str(again))["findings"][0]["evidence"][-1] == cited  # the last *success*
    (work / "code").write_text("4")
    same = run(jw, work, "--env", f"PYTHONPATH={packages(tmp_path, '2.12.0')}", code=4)
    said = jw.json("explain", str(same))["findings"][0]["evidence"][-1]
    assert said.startswith(f"nothing recorded changed since run 1 of job {good} succeeded")


def test_each_attempt_of_a_restarted_job_has_its_own(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "code").write_text("5")
    job = run(jw, work, "--restart", "on-failure", "--max-restarts", "1", "--restart-delay", "1", code=5)
    assert [r["n"] for r in jw.status(job)["runs"]] == [1, 2]
    with Store(jw.home) as store:
        first, second = store.fingerprint(job, 1), store.fingerprint(job, 2)
    assert first is not None and first == second
    lines = jw("diff", str(job), "--run", "2").stderr
    assert f"no run of job {job}'s command succeeded before run 2" in lines


def test_clear_errors(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "code").write_text("2")
    failed = run(jw, work, code=2)
    alone = jw("diff", str(failed))
    assert alone.returncode == 1 and alone.stdout == ""
    assert f"no run of job {failed}'s command succeeded before run 1" in alone.stderr
    assert f"jobwarden diff {failed} OTHER" in alone.stderr
    missing = jw("diff", "no-such-job")
    assert missing.returncode == 1 and "no job 'no-such-job'" in missing.stderr
    assert "no job" in jw("diff", str(failed), "--run", "7").stderr
    with Store(jw.home) as store:  # a run recorded by a jobwarden older than fingerprints
        old, _ = store.create_job(JobSpec(("python", "old.py"), str(work), "old", {}), {}, 1.7e9)
        store.update_run(old, 1, state=JobState.SUCCEEDED, pid=4242, started_at=1.7e9, ended_at=1.7e9 + 1)
    before = jw("diff", str(failed), str(old))
    assert before.returncode == 1
    assert f"run 1 of job {old} has no fingerprint: it was started by a jobwarden older" in before.stderr


def test_the_web_serves_what_changed(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    first = run(jw, work)
    second = run(jw, work, "--env", "WANDB_MODE=x")
    with web_server(jw.home) as served:
        client = Client(served)
        answer = client.get(f"/api/v1/jobs/{second}/diff").json()
        assert answer == jw.json("diff", str(second))
        none = client.get(f"/api/v1/jobs/{first}/diff")
        assert none.status == 200
        assert none.json()["changes"] is None and "succeeded before run 1" in none.json()["reason"]
        page = client.get(f"/jobs/{second}").text
        assert 'id="changes"' in page and "What changed" in page

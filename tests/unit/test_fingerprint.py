"""The fingerprint's reading (probes.fingerprint), its taking by the shim's helpers (shim.record.fingerprint)
and its storage (store.fingerprints): the interpreter a command runs, the packages where it imports from, the
git state of its directory, the GPUs it can see."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobwarden.joboptions import JobOptions
from jobwarden.model import JobSpec, JobState
from jobwarden.observations import Fingerprint, GitState, GpuDevice
from jobwarden.probes import fakenvml
from jobwarden.probes import fingerprint as probe
from jobwarden.probes.gpu import open_gpu_probe
from jobwarden.shim.record import fingerprint as shimfp
from jobwarden.shim.record.fingerprint import FingerprintTask
from jobwarden.shim.watch.gpuwatch import GpuWatch
from jobwarden.store import JobRecord, Store
from tests.support import eventually

NOW = 1_700_000_000.0
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def dist_info(directory: Path, name: str, version: str) -> None:
    info = directory / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def git_state(directory: Path) -> GitState | str | None:
    out = subprocess.run(["/bin/sh", "-c", probe.GIT_SCRIPT, "sh", str(directory)], capture_output=True)
    return probe.parse_git(out.stdout)


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --- the packages ---------------------------------------------------------------------------------------


def test_installed_reads_names_and_versions_from_the_directories(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    dist_info(first, "Foo_Bar", "1.0")
    dist_info(first, "torch", "2.13.0+cu124")
    dist_info(second, "foo-bar", "0.9")  # shadowed: an import finds the first
    dist_info(second, "zope.interface", "6.1")
    (second / "legacy-2.0-py3.11.egg-info").mkdir()
    (second / "develop.egg-info").mkdir()  # `setup.py develop`: the version only in PKG-INFO
    (second / "develop.egg-info" / "PKG-INFO").write_text("Name: develop\nVersion: 0.3.dev1\n\nbody\n")
    (second / "not-a-distribution").mkdir()
    found = probe.installed([str(first), "", str(second), str(tmp_path / "gone"), str(first)])
    assert found == (
        ("develop", "0.3.dev1"),
        ("foo-bar", "1.0"),
        ("legacy", "2.0"),
        ("torch", "2.13.0+cu124"),
        ("zope-interface", "6.1"),
    )


def test_the_package_list_is_what_importlib_metadata_lists(tmp_path: Path) -> None:
    """This interpreter's own environment, read through the snippet and the directory names alone."""
    from importlib.metadata import distributions

    out = subprocess.run(
        [sys.executable, "-S", "-B", "-c", probe.PY_SNIPPET], capture_output=True, check=True
    )
    parsed = probe.parse_python(out.stdout)
    assert parsed is not None and parsed[0] == ".".join(map(str, sys.version_info[:3]))
    expected = {(probe._normalised(d.metadata["Name"]), d.version) for d in distributions()}
    assert set(probe.installed(parsed[1])) == expected


def test_the_snippet_runs_no_site_customisation_of_the_job(tmp_path: Path) -> None:
    """-S: a sitecustomize or a .pth file on the job's path never runs in our helper."""
    (tmp_path / "sitecustomize.py").write_text("open(__file__ + '.ran', 'w').write('ran')\n")
    env = probe.python_env({**os.environ, "PYTHONPATH": "."}, str(tmp_path))
    out = subprocess.run([sys.executable, "-S", "-B", "-c", probe.PY_SNIPPET], env=env, capture_output=True)
    parsed = probe.parse_python(out.stdout)
    assert parsed is not None and str(tmp_path) in [
        os.path.normpath(p) for p in parsed[1]
    ]  # relative: the cwd
    assert not (tmp_path / "sitecustomize.py.ran").exists()
    assert not list(tmp_path.glob("__pycache__"))


def test_torch_cuda_is_read_from_version_py(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(
        "__version__ = '2.13.0+cu124'\ncuda: Optional[str] = '12.4'\n"
    )
    assert probe.torch_cuda(["/nonexistent", str(tmp_path)]) == "12.4"
    (tmp_path / "torch" / "version.py").write_text("__version__ = '2.13.0+cpu'\ncuda = None\n")
    assert probe.torch_cuda([str(tmp_path)]) is None


# --- the interpreter ------------------------------------------------------------------------------------


def test_the_interpreter_is_the_program_its_shebang_or_the_paths_python(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = executable(bin_dir / "python3.11", "")
    executable(bin_dir / "torchrun", f"#!{python}\nimport sys\n")
    via_env = executable(bin_dir / "tool", "#!/usr/bin/env python3.11\n")
    script = executable(tmp_path / "train.sh", "#!/bin/sh\npython3.11 x.py\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert probe.resolve_python(["python3.11", "x.py"], env, str(tmp_path)) == str(python)
    assert probe.resolve_python(["torchrun", "x.py"], env, str(tmp_path)) == str(python)
    assert probe.resolve_python([str(via_env)], env, str(tmp_path)) == str(python)
    assert probe.resolve_python(["./train.sh"], {"PATH": str(bin_dir)}, str(tmp_path)) is None
    executable(bin_dir / "python3", "")
    assert probe.resolve_python(["./train.sh"], env, str(tmp_path)) == str(bin_dir / "python3")
    assert script.exists()


# --- git ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_state_of_a_throwaway_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert git_state(repo) is None  # no repository
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("print(1)\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-q", "-m", "one")
    head = git(repo, "rev-parse", "HEAD")
    assert git_state(repo) == GitState(head, "main", dirty=False)
    (repo / "untracked.txt").write_text("not looked at\n")
    assert git_state(repo) == GitState(head, "main", dirty=False)
    (repo / "train.py").write_text("print(2)\n")
    dirty = git_state(repo)
    assert isinstance(dirty, GitState) and dirty.dirty and dirty.diff_hash
    diff = subprocess.run(["git", "-C", str(repo), "diff", "HEAD"], capture_output=True).stdout
    assert diff and diff.decode() not in str(dirty)  # hashed, never kept
    (repo / "train.py").write_text("print(3)\n")
    other = git_state(repo)
    assert isinstance(other, GitState) and other.diff_hash != dirty.diff_hash
    assert not (repo / ".git" / "index.lock").exists()


def test_git_answers_parse() -> None:
    assert probe.parse_git(b"nogit\n") == "nogit"
    assert probe.parse_git(b"") is None
    assert probe.parse_git(b"# branch.oid (initial)\n# branch.head main\n") == GitState(None, "main", False)
    detached = probe.parse_git(b"# branch.oid abc\n# branch.head (detached)\ndirty f00\n")
    assert detached == GitState("abc", None, True, "f00")


# --- GPUs -----------------------------------------------------------------------------------------------


def device(index: int, name: str = "NVIDIA H100 80GB HBM3") -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}a2b3c4d-0000-1111", name, 80 << 30, 0, 0.0)


def test_the_visible_gpus_follow_cuda_visible_devices() -> None:
    devices = [device(0), device(1), device(2)]
    assert probe.visible_gpus(devices, None) == tuple(
        f"{i} NVIDIA H100 80GB HBM3 GPU-{i}a2b3c4d" for i in range(3)
    )
    assert probe.visible_gpus(devices, "2,0") == ("2 NVIDIA H100 80GB HBM3 GPU-2a2b3c4d",
                                                  "0 NVIDIA H100 80GB HBM3 GPU-0a2b3c4d")  # fmt: skip
    assert probe.visible_gpus(devices, "GPU-1a2b") == ("1 NVIDIA H100 80GB HBM3 GPU-1a2b3c4d",)
    assert probe.visible_gpus(devices, "1,7,2") == (
        "1 NVIDIA H100 80GB HBM3 GPU-1a2b3c4d",
    )  # CUDA stops at 7
    assert probe.visible_gpus(devices, "") == ()
    assert probe.cuda_version(12040) == "12.4" and probe.cuda_version(None) is None


# --- the shim's task ------------------------------------------------------------------------------------


def job_record(cwd: Path, command: tuple[str, ...], env: dict[str, str] | None = None) -> JobRecord:
    return JobRecord(1, "train", command, str(cwd), NOW, JobOptions(), env or {})


def finished(task: FingerprintTask, gpu: GpuWatch | None = None) -> Fingerprint:
    eventually("the helpers ended", task.done, 30, every_s=0.01)
    return task.result(gpu)


def test_the_task_takes_the_fingerprint_with_helpers_of_its_own(tmp_path: Path) -> None:
    dist_info(tmp_path / "pkgs", "fakepkg", "1.0")
    job = job_record(tmp_path, (sys.executable, "-c", "pass"), {"WANDB_MODE": "secret-value"})
    env = {**os.environ, "PYTHONPATH": "pkgs", "WANDB_MODE": "secret-value", "CUDA_VISIBLE_DEVICES": "1"}
    task = FingerprintTask(job, env, time.monotonic)
    assert len(task.helper_pids()) == 2  # git's shell and the interpreter: the shim's, never the job's
    found = finished(task)
    assert task.helper_pids() == set()
    assert ("fakepkg", "1.0") in (found.packages or ())
    assert found.python == sys.executable
    assert found.python_version == ".".join(map(str, sys.version_info[:3]))
    assert (found.env_keys, found.cuda_visible, found.git, found.unknown) == (("WANDB_MODE",), "1", None, ())
    assert "secret-value" not in repr(found.to_json())


def test_a_helper_past_its_deadline_is_killed_and_its_part_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shimfp, "TIMEOUT_S", 0.5)
    slow = executable(tmp_path / "python3", "#!/bin/sh\nexec sleep 60\n")
    task = FingerprintTask(job_record(tmp_path, (str(slow), "x.py")), dict(os.environ), time.monotonic)
    pids = task.helper_pids()
    started = time.monotonic()
    found = finished(task)
    assert time.monotonic() - started < 10
    assert found.python == str(slow) and found.packages is None
    assert dict(found.unknown)["python"] == "no answer within 0.5 s"
    assert dict(found.unknown)["packages"] == "no answer within 0.5 s"
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)  # killed and reaped


def test_at_the_end_the_task_waits_a_moment_for_its_helpers(tmp_path: Path) -> None:
    task = FingerprintTask(job_record(tmp_path, (sys.executable, "-V")), dict(os.environ), time.monotonic)
    task.wait(30)
    assert task.helper_pids() == set()
    assert task.result(None).python_version is not None


def test_the_gpus_come_from_the_shims_gpu_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "nvml.json"
    devices = [fakenvml.device(0, name="NVIDIA H100"), fakenvml.device(1, name="NVIDIA H100")]
    fakenvml.write_state(
        state, {"devices": devices, "driver_version": "550.54.15", "cuda_driver_version": 12040}
    )
    monkeypatch.setenv(fakenvml.FAKE_NVML_ENV, str(state))
    gpu_probe = open_gpu_probe()
    assert gpu_probe is not None
    watch = GpuWatch(gpu_probe)
    try:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
        found = finished(FingerprintTask(job_record(tmp_path, ("true",)), env, time.monotonic), watch)
    finally:
        watch.close()
    assert found.gpus == ("1 NVIDIA H100 GPU-fake-000",)
    assert (found.driver, found.cuda_driver) == ("550.54.15", "12.4")


# --- the store ------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Store:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return Store(home)


def stored(store: Store, command: tuple[str, ...], packages: tuple[tuple[str, str], ...]) -> int:
    job_id, _ = store.create_job(JobSpec(command=command, cwd="/exp", name="t", env={}), {}, NOW)
    store.update_run(job_id, 1, state=JobState.SUCCEEDED, started_at=NOW + job_id, pid=100 + job_id)
    fp = Fingerprint(command=command, cwd="/exp", env_keys=(), host="h", jobwarden="0", packages=packages)
    store.set_fingerprint(job_id, 1, NOW + job_id, fp)
    return job_id


def test_a_fingerprint_reads_back_and_one_environment_is_stored_once(store: Store) -> None:
    packages = (("numpy", "2.1.0"), ("torch", "2.12.0"))
    first, second = stored(store, ("python", "a.py"), packages), stored(store, ("python", "a.py"), packages)
    assert store.fingerprint(first, 1) == store.fingerprint(second, 1)
    fp = store.fingerprint(second, 1)
    assert fp is not None and fp.packages == packages and fp.command == ("python", "a.py")
    assert store.fingerprint(second, 2) is None
    assert store._db.conn.execute("SELECT COUNT(*) FROM package_sets").fetchone()[0] == 1


def test_the_last_success_of_the_same_command(store: Store) -> None:
    one = stored(store, ("python", "a.py"), ())
    other = stored(store, ("python", "b.py"), ())
    three = stored(store, ("python", "a.py"), ())
    four = stored(store, ("python", "a.py"), ())
    store.update_run(three, 1, state=JobState.FAILED)
    assert store.last_success(("python", "a.py"), "/exp", NOW + four, besides=(four, 1)) == (one, 1)
    assert store.last_success(("python", "a.py"), "/exp", NOW + 100, besides=(0, 0)) == (four, 1)
    assert store.last_success(("python", "a.py"), "/elsewhere", NOW + 100, besides=(0, 0)) is None
    assert store.last_success(("python", "a.py"), "/exp", NOW + one, besides=(one, 1)) is None
    assert other


def test_removing_jobs_forgets_the_package_lists_no_run_names(store: Store) -> None:
    kept = stored(store, ("python", "a.py"), (("a", "1"),))
    gone = stored(store, ("python", "a.py"), (("b", "1"),))
    store.delete_job(gone)
    assert [r[0] for r in store._db.conn.execute("SELECT list FROM package_sets")] == ['[["a","1"]]']
    assert store.fingerprint(gone, 1) is None and store.fingerprint(kept, 1) is not None


@pytest.mark.parametrize("fixture", ["jobwarden-v1.db", "jobwarden-v4.db"])
def test_runs_of_an_old_database_have_no_fingerprint(tmp_path: Path, fixture: str) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shutil.copy(FIXTURES / fixture, home / "jobwarden.db")
    with Store(home) as old:
        job = old.jobs()[0]
        assert old.fingerprint(job.id, 1) is None
        assert old.last_success(job.command, job.cwd, NOW * 2, besides=(0, 0)) is None

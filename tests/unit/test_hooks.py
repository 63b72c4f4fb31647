"""The hooks' environment, and the pieces of the injected hooks that can be tested inside this process."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import jobwarden
from jobwarden import hooks
from jobwarden.errors import UsageError
from jobwarden.hooks import FAULT_SIGNAL, SITE_DIR, heartbeat_env, hook_env
from jobwarden.hooks.site import _jobwarden_hooks as injected

# --- hook_env ---------------------------------------------------------------------------------------


def env_for(base: dict[str, str], mp_start: str | None = None) -> dict[str, str]:
    return hook_env(Path("/run/py"), Path("/run/heartbeat"), 4242, mp_start, base)


def test_hook_env_sets_every_variable() -> None:
    assert env_for({}, "forkserver") == {
        "PYTHONPATH": str(SITE_DIR),
        "JOBWARDEN_PY_DIR": "/run/py",
        "JOBWARDEN_FAULT_SIGNAL": str(FAULT_SIGNAL),
        "JOBWARDEN_SHIM_PID": "4242",
        "JOBWARDEN_HEARTBEAT_FILE": "/run/heartbeat",
        "JOBWARDEN_MP_START": "forkserver",
        "TORCH_FR_BUFFER_SIZE": "256",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "256",
    }


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_the_users_own_flight_recorder_setting_wins(name: str) -> None:
    # either name set (0 turns the recorder off): neither is touched
    env = env_for({name: "0"})
    assert "TORCH_FR_BUFFER_SIZE" not in env
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env


def test_the_site_dir_goes_first_and_the_existing_pythonpath_is_kept_after_it() -> None:
    # an empty entry means the current directory: it must survive
    env = env_for({"PYTHONPATH": f"/a:{SITE_DIR}::/b"})
    assert env["PYTHONPATH"] == f"{SITE_DIR}:/a::/b"
    assert (SITE_DIR / "sitecustomize.py").is_file()


def test_relative_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = hook_env(Path("py"), Path("hb"), 1, None, {})
    assert env["JOBWARDEN_PY_DIR"] == str(tmp_path / "py")
    assert env["JOBWARDEN_HEARTBEAT_FILE"] == str(tmp_path / "hb")


def test_an_inherited_start_method_is_cleared_when_none_is_asked() -> None:
    assert env_for({"JOBWARDEN_MP_START": "spawn"})["JOBWARDEN_MP_START"] == ""
    assert "JOBWARDEN_MP_START" not in env_for({})


def test_an_unknown_start_method_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="fork"):
        env_for({}, "fork")


def test_heartbeat_env_alone() -> None:
    assert heartbeat_env(Path("/run/hb")) == {"JOBWARDEN_HEARTBEAT_FILE": "/run/hb"}


def test_the_fault_signal_is_a_real_time_signal_no_job_uses() -> None:
    assert signal.SIGRTMIN < FAULT_SIGNAL <= signal.SIGRTMAX
    assert FAULT_SIGNAL not in (signal.SIGUSR1, signal.SIGUSR2)


def test_both_sides_agree_on_the_names() -> None:
    # the injected hooks cannot import jobwarden: they repeat the names, which must not drift
    assert injected.PY_DIR_ENV == hooks.PY_DIR_ENV
    assert injected.FAULT_SIGNAL_ENV == hooks.FAULT_SIGNAL_ENV
    assert injected.SHIM_PID_ENV == hooks.SHIM_PID_ENV
    assert injected.MP_START_ENV == hooks.MP_START_ENV
    assert injected.MP_START_METHODS == hooks.MP_START_METHODS
    assert jobwarden._HEARTBEAT_FILE_ENV == hooks.HEARTBEAT_FILE_ENV


# --- the injected hooks, in this process ------------------------------------------------------------


def test_the_environment_is_read_once() -> None:
    job = injected.job_from_env(env_for({}, "spawn"))
    assert job is not None
    assert (job.py_dir, job.fault_signal, job.shim_pid, job.mp_start) == (
        "/run/py",
        FAULT_SIGNAL,
        4242,
        "spawn",
    )
    assert injected.job_from_env({}) is None
    odd = injected.job_from_env(
        {"JOBWARDEN_PY_DIR": "/p", "JOBWARDEN_FAULT_SIGNAL": "x", "JOBWARDEN_MP_START": "?"}
    )
    assert odd is not None
    assert (odd.fault_signal, odd.shim_pid, odd.mp_start) == (0, 0, None)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        2**70,
        1.5,
        1795302313.6905763,
        "",
        'quote " backslash \\ slash /',
        "control \x00\x01\n\t\x1f",
        "unicode é ü ñ 漢字",
        "astral \U0001f600",
        "lone surrogate \udcff",  # a file name undecodable in UTF-8
        [1, "a", None, [2.5]],
        (1, 2),
        {"pid": 3, "nested": {"k": [True]}, 4: "int key"},
    ],
)
def test_the_small_json_encoder_round_trips(value: object) -> None:
    expected = json.loads(json.dumps(value))
    assert json.loads(injected.dumps(value)) == expected


def test_the_small_json_encoder_writes_no_nan() -> None:
    assert json.loads(injected.dumps([float("nan"), float("inf")])) == [None, None]


def job_at(tmp_path: Path, shim_pid: int = os.getpid()) -> injected._Job:
    job = injected.job_from_env({"JOBWARDEN_PY_DIR": str(tmp_path), "JOBWARDEN_SHIM_PID": str(shim_pid)})
    assert job is not None
    return job


@pytest.mark.parametrize(("scope", "declared"), [(None, True), ("0\n", True), ("2\n", False), ("3\n", False)])
def test_ptracer_follows_the_yama_scope(tmp_path: Path, scope: str | None, declared: bool) -> None:
    path = tmp_path / "ptrace_scope"
    if scope is not None:
        path.write_text(scope)
    assert injected.declare_ptracer(job_at(tmp_path), str(path)) is declared


def test_ptracer_at_scope_1_is_what_the_kernel_says(tmp_path: Path) -> None:
    path = tmp_path / "ptrace_scope"
    path.write_text("1\n")
    # The real prctl runs: a kernel with Yama accepts it, one without answers EINVAL.
    yama = Path(injected.YAMA_SCOPE).exists()
    assert injected.declare_ptracer(job_at(tmp_path), str(path)) is yama
    assert injected.declare_ptracer(job_at(tmp_path, shim_pid=0), str(path)) is False


@pytest.fixture
def parked_thread() -> Iterator[threading.Thread]:
    release = threading.Event()
    parked = threading.Event()

    def park_here() -> None:
        parked.set()
        release.wait()

    thread = threading.Thread(target=park_here, name="parked")
    thread.start()
    assert parked.wait(30)
    yield thread
    release.set()
    thread.join(30)


def test_a_fork_record_names_every_other_thread(parked_thread: threading.Thread) -> None:
    record = injected.fork_record(sys._getframe(), 12.5)
    assert record is not None
    assert (record["at"], record["parent_pid"]) == (12.5, os.getpid())
    stack = record["stack"]
    assert isinstance(stack, list)
    assert stack[0]["function"] == "test_a_fork_record_names_every_other_thread"
    threads = record["threads"]
    assert isinstance(threads, list)
    (parked,) = [t for t in threads if t["name"] == "parked"]
    assert parked["tid"] == parked_thread.native_id
    assert [f["function"] for f in parked["frames"]][:3] == [
        "Condition.wait",
        "Event.wait",
        "parked_thread.<locals>.park_here",
    ]
    json.loads(injected.dumps(record))


def test_frames_are_capped() -> None:
    def recurse(n: int) -> list[dict[str, object]]:
        return injected.frames_of(sys._getframe(), limit=5) if n == 0 else recurse(n - 1)

    frames = recurse(20)
    assert len(frames) == 5
    assert {f["function"] for f in frames} == {"test_frames_are_capped.<locals>.recurse"}


def test_an_advert_has_the_exact_fields(tmp_path: Path) -> None:
    job = job_at(tmp_path)
    start = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
    injected.write_advert(job, os.getpid(), str(tmp_path / "x.stacks"), True, start)
    advert = json.loads((tmp_path / f"{os.getpid()}.json").read_text())
    assert advert == {
        "pid": os.getpid(),
        "start_time": int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19]),
        "python": ".".join(map(str, sys.version_info[:3])),
        "executable": sys.executable,
        "fault_signal": 0,  # this job has none configured
        "fault_file": str(tmp_path / "x.stacks"),
        "fault_fd": None,  # no faulthandler registered: nothing for the shim to check or signal
        "fault_file_id": None,
        "fault_withdrawn": None,
        "ptracer": True,
        "mp_start": None,
        "exe": [os.stat("/proc/self/exe").st_dev, os.stat("/proc/self/exe").st_ino],  # the interpreter
    }
    assert list(tmp_path.iterdir()) == [tmp_path / f"{os.getpid()}.json"]  # no temporary left behind


# --- heartbeat: jobwarden's and the fallback copy behave the same -------------------------------------

FALLBACK = SITE_DIR.parent / "fallback" / "jobwarden" / "__init__.py"


def load_fallback() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jobwarden_fallback_under_test", FALLBACK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["installed", "fallback"])
def beat_module(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    if request.param == "installed":
        saved = (jobwarden._beats.written_at, jobwarden._beats.pending)
        jobwarden._beats.written_at, jobwarden._beats.pending = float("-inf"), None
        yield jobwarden
        jobwarden._beats.written_at, jobwarden._beats.pending = saved
    else:
        yield load_fallback()


def test_the_fallback_is_the_same_code() -> None:
    def definitions(path: Path) -> list[str]:
        tree = ast.parse(path.read_text())
        found = []
        for node in tree.body:
            private = isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id.startswith("_") and not t.id.startswith("__")
                for t in node.targets
            )
            if private or isinstance(node, ast.FunctionDef | ast.ClassDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.FunctionDef | ast.ClassDef) and ast.get_docstring(inner):
                        inner.body.pop(0)  # docstrings may differ
                found.append(ast.dump(node))
        return found

    assert definitions(FALLBACK) == definitions(Path(jobwarden.__file__))
    assert load_fallback().__all__ == ["heartbeat"]


def test_heartbeat_writes_json_atomically(
    beat_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "heartbeat"
    monkeypatch.setenv("JOBWARDEN_HEARTBEAT_FILE", str(target))
    beat_module.heartbeat(step=3, loss=0.5)
    written = json.loads(target.read_text())
    assert written["info"] == {"step": 3, "loss": 0.5}
    assert isinstance(written["at"], float)
    assert list(tmp_path.iterdir()) == [target]
    assert target.stat().st_mode & 0o777 == 0o600


def test_a_ranks_heartbeat_is_also_written_to_its_own_file(
    beat_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: the job's file keeps whichever rank beat last; each rank's own file gives its step."""
    target = tmp_path / "heartbeat"
    monkeypatch.setenv("JOBWARDEN_HEARTBEAT_FILE", str(target))
    monkeypatch.setenv("RANK", "3")
    beat_module.heartbeat(step=7)
    assert json.loads((tmp_path / "heartbeat.rank3").read_text())["info"] == {"step": 7}
    assert json.loads(target.read_text())["info"] == {"step": 7}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heartbeat", "heartbeat.rank3"]


def test_the_heartbeat_reads_the_rank_as_the_supervisor_does() -> None:
    from jobwarden.model import GLOBAL_RANK_VARIABLES

    assert jobwarden._RANK_VARIABLES == GLOBAL_RANK_VARIABLES  # type: ignore[attr-defined]


def test_heartbeat_is_rate_limited_but_the_last_info_wins(
    beat_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "heartbeat"
    monkeypatch.setenv("JOBWARDEN_HEARTBEAT_FILE", str(target))
    beat_module.heartbeat(step=1)
    beat_module.heartbeat(step=2)
    beat_module.heartbeat(step=3)
    assert json.loads(target.read_text())["info"] == {"step": 1}  # within 0.5 s: not written
    beat_module._beats.written_at -= 1.0  # as if a second had passed
    beat_module.heartbeat(step=4)
    assert json.loads(target.read_text())["info"] == {"step": 4}
    beat_module.heartbeat(step=5)
    beat_module._beats.flush()  # what atexit does
    assert json.loads(target.read_text())["info"] == {"step": 5}


def test_heartbeat_outside_a_job_does_nothing(
    beat_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOBWARDEN_HEARTBEAT_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    beat_module.heartbeat(step=1)
    assert list(tmp_path.iterdir()) == []


def test_heartbeat_never_raises_into_the_job(
    beat_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBWARDEN_HEARTBEAT_FILE", str(tmp_path / "missing" / "heartbeat"))
    beat_module.heartbeat(step=1)


def test_heartbeat_writes_what_json_cannot(
    beat_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Scalar:  # like a numpy float
        def __float__(self) -> float:
            return 0.25

    target = tmp_path / "heartbeat"
    monkeypatch.setenv("JOBWARDEN_HEARTBEAT_FILE", str(target))
    beat_module.heartbeat(loss=Scalar(), where=Path("/data"))
    assert json.loads(target.read_text())["info"] == {"loss": 0.25, "where": "/data"}


def test_the_chained_sitecustomize_is_looked_for_by_name_not_by_listing(tmp_path: Path) -> None:
    """Issue 25: asking the import system about each folder after the hooks' lists it, 0.1 ms of every
    start; a few access() calls say where a sitecustomize could be, and only those are asked."""
    from jobwarden.hooks.site._jobwarden_hooks import _may_hold_sitecustomize

    empty, module, package, extension = (tmp_path / n for n in ("empty", "module", "package", "extension"))
    for folder in (empty, module, package, extension):
        folder.mkdir()
    (module / "sitecustomize.py").write_text("")
    (package / "sitecustomize").mkdir()  # a package, or a namespace package
    (extension / "sitecustomize.so").write_bytes(b"")
    (tmp_path / "stdlib.zip").write_bytes(b"")
    assert not _may_hold_sitecustomize(str(empty))
    assert all(_may_hold_sitecustomize(str(f)) for f in (module, package, extension))
    assert _may_hold_sitecustomize(str(tmp_path / "stdlib.zip"))  # a zip file: the import system says
    assert not _may_hold_sitecustomize(str(tmp_path / "absent.zip"))

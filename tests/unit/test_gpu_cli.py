"""`run --gpus N` / `--gpu-ids I,J`: validated before anything is recorded, kept in the job's options, and
the job starts in `queued` (its shim claims the GPUs). The shim is replaced here: nothing is started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobwarden.cli.main import build_parser, main
from jobwarden.model import JobState
from jobwarden.probes import fakenvml
from jobwarden.store import Store


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("JOBWARDEN_HOME", str(path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    # a machine with 4 GPUs (NVML is the fake one): `run` checks that the request can be met here
    gpus = tmp_path / "nvml.json"
    fakenvml.write_state(gpus, {"devices": [fakenvml.device(i) for i in range(4)]})
    monkeypatch.setenv(fakenvml.FAKE_NVML_ENV, str(gpus))
    return path


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Stand in for the shim: record what would be started, report a pid."""
    calls: list[tuple[int, int]] = []

    class FakeShim:
        pid = 1

        def __enter__(self) -> FakeShim:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def start(self, job_id: int, run: int) -> dict[str, Any]:
            calls.append((job_id, run))
            return {"pid": None, "state": "queued"}

    monkeypatch.setattr("jobwarden.control.shimproc.fork_shim", lambda home, mode, attached=False: FakeShim())
    return calls


def test_the_options_parse() -> None:
    args = build_parser().parse_args(["run", "--gpus", "2", "--gpu-ids", "0,3", "--", "python", "t.py"])
    assert (args.gpus, args.gpu_ids, args.argv[-1]) == ("2", "0,3", "t.py")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "0"], "bad --gpus '0': a number of GPUs >= 1"),
        (["--gpus", "-1"], "bad --gpus '-1': a number of GPUs >= 1"),
        (["--gpus", "two"], "bad --gpus 'two': a number of GPUs >= 1"),
        (["--gpus", "²"], "bad --gpus '²': a number of GPUs >= 1"),
        (["--gpu-ids", "0,,3"], "bad --gpu-ids '0,,3': GPU indexes >= 0, comma-separated"),
        (["--gpu-ids", "-1"], "bad --gpu-ids '-1': GPU indexes >= 0, comma-separated"),
        (["--gpu-ids", "a"], "bad --gpu-ids 'a': GPU indexes >= 0, comma-separated"),
        (["--gpu-ids", "1,1"], "bad --gpu-ids '1,1': a GPU is named twice"),
        (["--gpus", "1", "--gpu-ids", "0"], "--gpus and --gpu-ids exclude each other"),
    ],
)
def test_bad_values_are_one_line_errors_and_nothing_is_recorded(
    home: Path, started: list[Any], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["run", *argv, "--", "true"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"jobwarden: {message}"
    assert len(err) == 2 and err[1].startswith("  ")  # the message, then its remedy
    assert started == [] and not home.exists()


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["--gpus", "2"], (2, None)),
        (["--gpu-ids", "3, 0"], (None, (3, 0))),
    ],
)
def test_a_gpu_job_is_recorded_queued_with_its_request(
    home: Path,
    started: list[Any],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    options: tuple[int | None, tuple[int, ...] | None],
) -> None:
    assert main(["run", *argv, "--json", "--", "true"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "queued"
    with Store(home) as store:
        job = store.job(1)
        assert (job.options.gpus, job.options.gpu_ids) == options
        assert store.run(1).state == JobState.QUEUED
    assert started == [(1, 1)]


def test_a_job_without_gpus_starts_as_before(home: Path, started: list[Any]) -> None:
    assert main(["run", "--", "true"]) == 0
    with Store(home) as store:
        assert store.run(1).state == JobState.STARTING
        assert (store.job(1).options.gpus, store.job(1).options.gpu_ids) == (None, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "5"], "--gpus: asks for 5 GPUs, this machine has 4"),
        (["--gpu-ids", "1,7"], "--gpu-ids: no GPU 7 here: this machine has 4 GPUs (0-3)"),
    ],
)
def test_a_request_this_machine_cannot_meet_is_refused_and_nothing_is_recorded(
    home: Path, started: list[Any], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """A refused start is never a failed job in the lists (issue 21)."""
    assert main(["run", *argv, "--", "true"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"jobwarden: {message}"
    assert started == [] and not home.exists()


def test_without_gpus_run_says_there_are_none(
    home: Path, started: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "install pynvml": there is nothing to install on a machine without GPUs."""
    from jobwarden.probes import gpu

    monkeypatch.delenv(fakenvml.FAKE_NVML_ENV)
    monkeypatch.setattr(gpu, "DRIVER_FILES", (str(home / "no-nvidiactl"),))
    assert main(["run", "--gpus", "1", "--", "true"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("jobwarden: --gpus: this machine has no GPUs: no NVIDIA driver (")
    assert "pynvml" not in "\n".join(err) and "without --gpus" in err[1]
    assert started == [] and not home.exists()

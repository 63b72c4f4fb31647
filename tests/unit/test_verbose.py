"""-v and -vv say what the CLI does; a bug of ours is one clear line, its traceback only with -vv."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from jobwarden import trace
from jobwarden.cli import main
from jobwarden.cli.commands import ps


@pytest.fixture(autouse=True)
def quiet_again() -> object:
    yield None
    trace.set_level(0)


def _boom(args: argparse.Namespace) -> int:
    raise RuntimeError("a bug")


def test_an_internal_error_is_one_line_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("JOBWARDEN_HOME", str(tmp_path))
    monkeypatch.setattr(ps, "handle", _boom)
    assert main.main(["ps"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("jobwarden: internal error: RuntimeError: a bug\n")
    assert "Traceback" not in err and "-vv" in err


def test_with_vv_the_internal_error_shows_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("JOBWARDEN_HOME", str(tmp_path))
    monkeypatch.setattr(ps, "handle", _boom)
    assert main.main(["-vv", "ps"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_levels(capsys: pytest.CaptureFixture[str]) -> None:
    trace.info("hidden")
    trace.set_level(1)
    trace.info("a step")
    trace.debug("hidden detail")
    trace.set_level(2)
    trace.debug("a detail")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["a step", "a detail"]

"""--mem-limit, --restart and --max-restarts: parsing, validation, and what lands in the job's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden import config
from jobwarden.cli.main import build_parser, main
from jobwarden.control.options import memory_and_restart_options
from jobwarden.errors import UsageError


@pytest.mark.parametrize(
    ("text", "mode"),
    [("no", "no"), ("on-failure", "on-failure"), ("always", "always"), (" Always ", "always")],
)
def test_restart_modes(text: str, mode: str) -> None:
    assert config.parse_restart_mode(text) == mode


@pytest.mark.parametrize("text", ["", "yes", "on_failure", "onfailure", "never", "unless-stopped"])
def test_a_bad_restart_mode_lists_the_good_ones(text: str) -> None:
    with pytest.raises(UsageError) as info:
        config.parse_restart_mode(text)
    assert info.value.remedy == "use one of: no, on-failure, always"
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("text", "n"), [("0", 0), ("3", 3), (" 12 ", 12), ("007", 7)])
def test_counts(text: str, n: int) -> None:
    assert config.parse_count(text) == n


@pytest.mark.parametrize("text", ["", "-1", "1.5", "three", "+3", "1e3", "inf"])
def test_a_bad_count_says_what_it_was_for(text: str) -> None:
    with pytest.raises(UsageError) as info:
        config.parse_count(text, "--max-restarts")
    assert info.value.message.startswith(f"bad --max-restarts {text!r}")
    assert "whole number" in info.value.message


@pytest.mark.parametrize(("text", "size"), [("64M", 64 << 20), ("8G", 8 << 30), ("4MiB", 4 << 20)])
def test_memory_limits(text: str, size: int) -> None:
    assert config.parse_mem_limit(text) == size


@pytest.mark.parametrize("text", ["512", "100k", "3M"])
def test_a_limit_too_small_to_run_anything_is_a_forgotten_unit(text: str) -> None:
    with pytest.raises(UsageError) as info:
        config.parse_mem_limit(text)
    assert info.value.remedy.startswith(f"give a unit, e.g. {text}M")


@pytest.mark.parametrize("text", ["lots", "-5G", "0"])
def test_a_bad_memory_limit(text: str) -> None:
    with pytest.raises(UsageError):
        config.parse_mem_limit(text)


# --- the job's options ----------------------------------------------------------------------------------


def test_the_defaults() -> None:
    assert memory_and_restart_options(None, None, None) == {
        "mem_limit_bytes": None,
        "restart": "no",
        "max_restarts": config.DEFAULT_MAX_RESTARTS,
    }


def test_all_given() -> None:
    assert memory_and_restart_options("2G", "always", "5") == {
        "mem_limit_bytes": 2 << 30,
        "restart": "always",
        "max_restarts": 5,
    }


def test_restart_alone_gets_the_default_budget() -> None:
    assert memory_and_restart_options(None, "on-failure", None)["max_restarts"] == config.DEFAULT_MAX_RESTARTS


def test_max_restarts_alone_means_on_failure() -> None:
    options = memory_and_restart_options(None, None, "2")
    assert (options["restart"], options["max_restarts"]) == ("on-failure", 2)


def test_max_restarts_zero_alone_restarts_nothing() -> None:
    options = memory_and_restart_options(None, None, "0")
    assert (options["restart"], options["max_restarts"]) == ("no", 0)


def test_restarts_with_restart_no_contradict_each_other() -> None:
    with pytest.raises(UsageError) as info:
        memory_and_restart_options(None, "no", "3")
    assert "--restart no" in info.value.message and "on-failure" in info.value.remedy


@pytest.mark.parametrize(
    ("args", "bad"), [(("1", None, None), "--mem-limit"), ((None, "x", None), "--restart")]
)
def test_bad_values_are_usage_errors(args: tuple[str | None, str | None, str | None], bad: str) -> None:
    with pytest.raises(UsageError) as info:
        memory_and_restart_options(*args)
    assert bad in info.value.message


# --- the command line -----------------------------------------------------------------------------------


def test_run_takes_the_options() -> None:
    args = build_parser().parse_args(
        ["run", "--mem-limit", "8G", "--restart", "on-failure", "--max-restarts", "5", "--", "python", "t.py"]
    )
    assert (args.mem_limit, args.restart, args.max_restarts) == ("8G", "on-failure", "5")
    assert args.argv[-2:] == ["python", "t.py"]


def test_run_without_them() -> None:
    args = build_parser().parse_args(["run", "--", "true"])
    assert (args.mem_limit, args.restart, args.max_restarts) == (None, None, None)


def test_a_bad_value_fails_before_anything_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JOBWARDEN_HOME", str(tmp_path / "home"))
    assert main(["run", "--restart", "sometimes", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "bad --restart 'sometimes'" in err and "no, on-failure, always" in err
    assert not (tmp_path / "home").exists()  # no job recorded, no shim started

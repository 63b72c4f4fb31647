"""The public surface: what each package exports, and the command line's contract."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import types

import pytest

import jobwarden
from jobwarden.cli.main import build_parser, main

EXPORTS = {
    "jobwarden": ["__version__", "heartbeat"],
    "jobwarden.store": ["JobRecord", "JobSummary", "RunRecord", "Store"],
    "jobwarden.rules": ["RunEvidence", "explain"],
}


@pytest.mark.parametrize(("package", "names"), EXPORTS.items())
def test_all_lists_exactly_the_exports(package: str, names: list[str]) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(names)
    assert len(set(module.__all__)) == len(module.__all__)


@pytest.mark.parametrize("package", EXPORTS)
def test_every_exported_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(module.__all__)


@pytest.mark.parametrize("package", EXPORTS)
def test_nothing_public_is_left_out_of_all(package: str) -> None:
    # Submodules are reachable as attributes once imported; they are not exports.
    module = importlib.import_module(package)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(module.__all__)


def test_version_matches_the_installed_distribution() -> None:
    assert jobwarden.__version__ == importlib.metadata.version("jobwarden")


def test_version_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jobwarden {jobwarden.__version__}"


# --- the command line contract ----------------------------------------------------------------------

SUBCOMMANDS = {"run", "ps", "status", "logs", "stop", "adopt", "explain", "rm"}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def options(command: str) -> set[str]:
    return {opt for a in subparsers(build_parser())[command]._actions for opt in a.option_strings}


def test_the_contract_subcommands_exist() -> None:
    assert set(subparsers(build_parser())) >= SUBCOMMANDS


def test_a_subcommand_is_required() -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([])
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("command", "contract"),
    [
        ("run", {"--name", "--cwd", "--env", "--timeout", "-f", "--follow", "-w", "--wait", "--json"}),
        ("logs", {"-f", "--follow", "-n", "--since", "--run"}),
        ("stop", {"--grace", "--json"}),
        ("ps", {"--all", "--json"}),
        ("status", {"--json"}),
        ("explain", {"--json"}),
        ("web", {"--host", "--port"}),  # docs/architecture.md "Frontends"
    ],
)
def test_the_contract_options_exist(command: str, contract: set[str]) -> None:
    assert options(command) >= contract


def test_run_options_parse() -> None:
    args = build_parser().parse_args(
        [
            *("run", "--name", "exp1", "--cwd", "/srv", "--env", "A=1", "--env", "B=2", "--timeout", "12h"),
            *("-f", "-w", "--json", "--", "python", "train.py"),
        ]
    )
    assert (args.command, args.name, args.cwd, args.env, args.timeout) == (
        "run",
        "exp1",
        "/srv",
        ["A=1", "B=2"],
        "12h",
    )
    assert (args.follow, args.wait, args.json) == (True, True, True)
    assert args.argv[-2:] == ["python", "train.py"]


def test_run_leaves_the_options_after_the_command_to_the_command() -> None:
    args = build_parser().parse_args(["run", "python", "train.py", "--json", "-f"])
    assert args.argv == ["python", "train.py", "--json", "-f"]
    assert (args.json, args.follow) == (False, False)


def test_logs_options_parse() -> None:
    args = build_parser().parse_args(["logs", "exp1", "-f", "-n", "50", "--since", "10m", "--run", "2"])
    assert (args.job, args.follow, args.lines, args.since, args.run) == (["exp1"], True, "50", "10m", 2)
    several = build_parser().parse_args(["logs", "-f", "3", "5", "@last"])
    assert several.job == ["3", "5", "@last"]


@pytest.mark.parametrize("value", ["many", "-5", "1.5"])
def test_logs_n_must_be_a_count_or_all(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "1", "-n", value]) == 2  # refused before any store is opened
    err = capsys.readouterr().err
    assert err.startswith("jobwarden: -n: bad line count") and "-n all" in err


def test_stop_grace_and_ps_all_parse() -> None:
    parser = build_parser()
    assert parser.parse_args(["stop", "exp1", "--grace", "30s"]).grace == "30s"
    assert parser.parse_args(["stop", "exp1"]).grace is None
    assert parser.parse_args(["ps", "--all"]).all is True
    assert parser.parse_args(["ps"]).all is False


@pytest.mark.parametrize("argv", [["ps"], ["status", "1"], ["stop", "1"], ["explain", "1"]])
def test_json_parses_on_ps_status_stop_explain(argv: list[str]) -> None:
    assert build_parser().parse_args([*argv, "--json"]).json is True
    assert build_parser().parse_args(argv).json is False

"""Shell completion, run in the real shells: subcommands, a subcommand's options, job ids and names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden

pytestmark = pytest.mark.integration


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing: scripts/test installs it")
        pytest.skip(f"{name} is not installed")
    return path


@pytest.fixture
def on_path(jw: Jobwarden, tmp_path: Path) -> Jobwarden:
    """`jobwarden` on PATH, as the scripts call it, running this checkout against the test's home."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "jobwarden"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m jobwarden "$@"\n')
    launcher.chmod(0o755)
    jw.env["PATH"] = f"{bin_dir}:{jw.env['PATH']}"
    return jw


def _bash_complete(jw: Jobwarden, words: list[str]) -> list[str]:
    script = jw("completion", "bash", check=True).stdout
    program = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        '_jobwarden; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [_shell("bash"), "-c", program], env=jw.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_subcommands_options_and_jobs(on_path: Jobwarden) -> None:
    on_path("run", "--name", "train-lr3", "--wait", "--", "true", check=True)
    assert _bash_complete(on_path, ["jobwarden", "st"]) == ["status", "stop"]
    assert _bash_complete(on_path, ["jobwarden", "stop", "--f"]) == ["--force"]
    assert _bash_complete(on_path, ["jobwarden", "logs", "tr"]) == ["train-lr3"]
    assert _bash_complete(on_path, ["jobwarden", "explain", ""]) == ["1", "train-lr3"]
    assert _bash_complete(on_path, ["jobwarden", "completion", "z"]) == ["zsh"]
    assert "_jobs" not in _bash_complete(on_path, ["jobwarden", ""])


def test_fish_completes_subcommands_options_and_jobs(on_path: Jobwarden, tmp_path: Path) -> None:
    fish = _shell("fish")
    on_path("run", "--name", "train-lr3", "--wait", "--", "true", check=True)
    script = tmp_path / "jobwarden.fish"
    script.write_text(on_path("completion", "fish", check=True).stdout)

    def complete(line: str) -> list[str]:
        done = subprocess.run(
            [fish, "--no-config", "-c", f"source {script}; complete -C {line!r}"],
            env=on_path.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert complete("jobwarden sto") == ["stop"]
    assert complete("jobwarden stop --fo") == ["--force"]
    assert "train-lr3" in complete("jobwarden status ")


def test_the_zsh_script_loads(on_path: Jobwarden, tmp_path: Path) -> None:
    script = tmp_path / "_jobwarden"
    script.write_text(on_path("completion", "zsh", check=True).stdout)
    program = f"autoload -U compinit && compinit -u; source {script}; whence -w _jobwarden"
    done = subprocess.run(
        [_shell("zsh"), "-f", "-c", program],
        env=on_path.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "_jobwarden: function" in done.stdout


def test_an_unknown_shell_is_a_clear_error(jw: Jobwarden) -> None:
    result = jw("completion", "tcsh")
    assert result.returncode == 2 and "unknown shell 'tcsh'" in result.stderr

"""Shell completion, run in the real shells: subcommands, a subcommand's options, job ids and names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, wait_pid_gone
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed")
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


def _bash_complete(jw: Jobwarden, words: list[str], lines: bool = False) -> list[str]:
    script = jw("completion", "bash", check=True).stdout
    program = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        '_jobwarden; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [_shell("bash"), "-c", program], env=jw.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines() if lines else done.stdout.split()


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


# --- job names are data, never code (issue 20, item 2) ------------------------------------------------

HOSTILE = ("x$(touch {marker})", "y`touch {marker}`", "my name", "z*")
DEADLINE_S = 60.0


def _hostile_jobs(jw: Jobwarden, marker: Path) -> None:
    for name in HOSTILE:
        jw("run", "--name", name.format(marker=marker), "--wait", "--", "true", check=True)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[list[str]]:
    _shell("tmux")
    command = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    yield command
    listed = [*command, "list-panes", "-a", "-F", "#{pid} #{pane_pid}"]
    pids = subprocess.run(listed, capture_output=True, text=True, timeout=30).stdout.split()
    subprocess.run([*command, "kill-server"], capture_output=True, timeout=30)
    for pid in pids:  # the server and its shell: both carry the test's home
        wait_pid_gone(int(pid))


def _typed_then_tab(tmux: list[str], env: dict[str, str], shell: list[str], setup: str, line: str) -> str:
    """`line` typed into an interactive shell in a real terminal, then Tab: the command line it shows."""
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "sh", "-x", "200", "-y", "20", *shell],
        env=env,
        check=True,
        timeout=30,
    )
    subprocess.run(
        [*tmux, "send-keys", "-t", "sh", f"PS1='ready> '; {setup}; echo loaded", "Enter"], timeout=30
    )
    _screen(tmux, lambda s: "\nloaded" in s)
    subprocess.run([*tmux, "send-keys", "-t", "sh", line, "Tab"], check=True, timeout=30)
    typed = f"ready> {line}".rstrip()

    def completed(screen: str) -> bool:  # typed whole (the shell echoes it key by key), then grown by Tab
        last = screen.rstrip().splitlines()[-1].rstrip()
        return last.startswith(typed) and last != typed

    return _screen(tmux, completed)


def _screen(tmux: list[str], done: object) -> str:
    def there() -> str | None:
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "sh"], capture_output=True, text=True, timeout=30
        ).stdout
        return screen if screen.strip() and done(screen) else None  # type: ignore[operator]

    return eventually("the terminal got there", there, DEADLINE_S, every_s=0.05).rstrip().splitlines()[-1]


SHELLS_IN_A_TERMINAL = {
    "bash": (["--norc", "--noprofile"], "source {script}"),
    "zsh": (["-f"], "autoload -U compinit && compinit -u; source {script}"),
}


@pytest.mark.parametrize("shell", sorted(SHELLS_IN_A_TERMINAL))
@pytest.mark.parametrize(
    ("typed", "completed"),
    [("x", "x\\$\\(touch\\ {marker}\\)"), ("y", "y\\`touch\\ {marker}\\`"), ("my", "my\\ name")],
)
def test_a_job_name_completes_as_one_quoted_word_and_never_runs(
    on_path: Jobwarden, tmp_path: Path, tmux: list[str], shell: str, typed: str, completed: str
) -> None:
    # bash's `compgen -W "$(jobwarden _jobs)"` expanded $(...) and backticks in a name at the next Tab,
    # and split a name at its spaces
    marker = tmp_path / "ran"
    _hostile_jobs(on_path, marker)
    script = tmp_path / "script"
    script.write_text(on_path("completion", shell, check=True).stdout)
    flags, setup = SHELLS_IN_A_TERMINAL[shell]
    env = {**on_path.env, "TERM": "xterm-256color"}
    shown = _typed_then_tab(
        tmux, env, [_shell(shell), *flags], setup.format(script=script), f"jobwarden status {typed}"
    )
    assert shown == f"ready> jobwarden status {completed.format(marker=marker)}"
    assert not marker.exists(), "completing a job name ran the command inside it"


def test_bash_replies_each_name_as_one_quoted_word(on_path: Jobwarden, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _hostile_jobs(on_path, marker)
    replies = _bash_complete(on_path, ["jobwarden", "logs", ""], lines=True)
    names = [f"x\\$\\(touch\\ {marker}\\)", f"y\\`touch\\ {marker}\\`", "my\\ name", "z\\*"]
    assert replies == [x for i in (4, 3, 2, 1) for x in (str(i), names[i - 1])]
    assert not marker.exists()


def test_fish_offers_hostile_names_verbatim_and_runs_none(on_path: Jobwarden, tmp_path: Path) -> None:
    fish = _shell("fish")
    marker = tmp_path / "ran"
    _hostile_jobs(on_path, marker)
    script = tmp_path / "jobwarden.fish"
    script.write_text(on_path("completion", "fish", check=True).stdout)
    done = subprocess.run(
        [fish, "--no-config", "-c", f"source {script}; complete -C 'jobwarden status '"],
        env=on_path.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    offered = {row.split("\t")[0] for row in done.stdout.splitlines()}
    assert {name.format(marker=marker) for name in HOSTILE} <= offered
    assert not marker.exists()


# --- option values and run numbers (issue 21) ------------------------------------------------------------


def _fish_complete(jw: Jobwarden, tmp_path: Path, line: str) -> list[str]:
    script = tmp_path / "jobwarden.fish"
    script.write_text(jw("completion", "fish", check=True).stdout)
    done = subprocess.run(
        [_shell("fish"), "--no-config", "-c", f"source {script}; complete -C {line!r}"],
        env=jw.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [row.split("\t")[0] for row in done.stdout.splitlines()]


def _restarted_job(jw: Jobwarden) -> None:
    """Job 1, `flaky`, with three runs; job 2 with one."""
    options = ("--name", "flaky", "--restart", "on-failure", "--max-restarts", "2", "--restart-delay", "0.1s")
    jw("run", "-w", *options, "--", "false")
    jw("run", "-w", "--name", "once", "--", "true", check=True)


def test_bash_completes_option_values_and_run_numbers(on_path: Jobwarden) -> None:
    _restarted_job(on_path)

    def complete(*words: str) -> list[str]:
        return _bash_complete(on_path, ["jobwarden", *words])

    assert complete("run", "--on-hang", "") == ["dump", "stop", "restart"]
    assert complete("run", "--on-hang", "re") == ["restart"]
    assert complete("run", "--restart", "on") == ["on-failure"]
    assert complete("run", "--mp-start", "") == ["spawn", "forkserver"]
    assert complete("run", "--max-restarts", "u") == ["unlimited"]
    assert complete("ps", "--state", "fa") == ["failed"]
    assert complete("ps", "--state", "failed,lo") == ["failed,lost"]  # the word after the comma
    assert complete("boot", "e") == ["enable"]
    assert complete("explain", "1", "--run", "") == ["1", "2", "3"]  # job 1's runs
    assert complete("explain", "flaky", "--run", "") == ["1", "2", "3"]  # by name
    assert complete("status", "--json", "2", "--run", "") == ["1"]
    assert complete("logs", "@last", "--run", "") == ["1"]
    assert complete("metrics", "9", "--run", "") == []  # no such job: nothing, no error


def test_fish_completes_option_values_and_run_numbers(on_path: Jobwarden, tmp_path: Path) -> None:
    _restarted_job(on_path)
    assert _fish_complete(on_path, tmp_path, "jobwarden run --on-hang ") == ["dump", "restart", "stop"]
    assert _fish_complete(on_path, tmp_path, "jobwarden run --restart on") == ["on-failure"]
    assert "failed,lost" in _fish_complete(on_path, tmp_path, "jobwarden ps --state failed,")
    assert _fish_complete(on_path, tmp_path, "jobwarden explain 1 --run ") == ["1", "2", "3"]
    assert _fish_complete(on_path, tmp_path, "jobwarden status once --run ") == ["1"]


@pytest.mark.parametrize("shell", sorted(SHELLS_IN_A_TERMINAL))
def test_a_run_number_completes_in_a_terminal(
    on_path: Jobwarden, tmp_path: Path, tmux: list[str], shell: str
) -> None:
    _restarted_job(on_path)
    script = tmp_path / "script"
    script.write_text(on_path("completion", shell, check=True).stdout)
    flags, setup = SHELLS_IN_A_TERMINAL[shell]
    env = {**on_path.env, "TERM": "xterm-256color"}
    shown = _typed_then_tab(
        tmux, env, [_shell(shell), *flags], setup.format(script=script), "jobwarden explain once --run "
    )
    assert shown == "ready> jobwarden explain once --run 1"

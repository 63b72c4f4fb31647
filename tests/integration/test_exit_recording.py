"""Every run ends with an exit code or a signal name; `--wait` exits as a shell would."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden

pytestmark = pytest.mark.integration


def test_run_returns_with_the_pid_recorded(jw: Jobwarden) -> None:
    job = jw.start("sh", "-c", "exit 0", options=("--name", "quick"))
    assert job["name"] == "quick"
    assert isinstance(job["id"], int)
    assert isinstance(job["pid"], int)
    assert job["state"] == "running"
    assert jw("wait", "quick").returncode == 0
    status = jw.status("quick")
    assert (status["state"], status["exit_code"], status["signal"]) == ("succeeded", 0, None)
    assert status["started_at"] and status["ended_at"]


def test_run_started_with_its_output_streams_closed(jw: Jobwarden) -> None:
    """A CLI started with fds 1 and 2 closed (`cmd >&- 2>&-`) has no sys.stdout to flush, and its shim
    opens the store before it redirects its streams: the redirect must not swap the database for the
    shim's log."""
    script = 'exec "$@" >&- 2>&-'
    cli = (sys.executable, "-m", "jobwarden", "run", "--name", "closed", "--", "sh", "-c", "echo fine")
    started = subprocess.run(("sh", "-c", script, "sh", *cli), env=jw.env, timeout=60, check=False)
    assert started.returncode == 0
    assert jw("wait", "closed").returncode == 0
    assert jw.status("closed")["state"] == "succeeded"
    assert jw.output(1) == "fine\n"
    assert jw("ps", "--all").returncode == 0  # the database is whole
    assert "Traceback" not in (jw.home / "jobs" / "1" / "run-1" / "shim.log").read_text()


def test_wait_exits_with_the_jobs_exit_code(jw: Jobwarden) -> None:
    result = jw("run", "--wait", "--", "sh", "-c", "echo failing; exit 3")
    assert result.returncode == 3
    status = jw.status(result.stdout.split()[0])
    assert (status["state"], status["exit_code"], status["signal"]) == ("failed", 3, None)
    assert any(f["rule"] == "exit-code" for f in status["findings"])


@pytest.mark.parametrize(
    ("sig", "rule"),
    [
        (signal.SIGKILL, "killed-externally"),
        (signal.SIGTERM, "killed-externally"),
        (signal.SIGSEGV, "native-crash"),
        (signal.SIGHUP, "terminal-hangup"),
        (signal.SIGPIPE, "broken-pipe"),
    ],
)
def test_signal_deaths_are_recorded_by_name(jw: Jobwarden, sig: signal.Signals, rule: str) -> None:
    result = jw("run", "--wait", "--", "sh", "-c", f"kill -{sig.name[3:]} $$")
    assert result.returncode == 128 + sig
    job_id = result.stdout.split()[0]
    status = jw.status(job_id)
    assert (status["state"], status["signal"], status["exit_code"]) == ("failed", sig.name, None)
    explained = jw.json("explain", job_id)
    assert explained["findings"][0]["rule"] == rule
    assert explained["signal"] == sig.name


def test_python_exception_is_named(jw: Jobwarden) -> None:
    code = "def load():\n    raise ValueError('bad checkpoint shape')\nload()\n"
    result = jw("run", "--wait", "--", sys.executable, "-c", code)
    assert result.returncode == 1
    finding = jw.json("explain", result.stdout.split()[0])["findings"][0]
    assert finding["rule"] == "python-exception"
    assert "ValueError: bad checkpoint shape" in finding["evidence"]


def test_unknown_command_fails_at_once_with_127(jw: Jobwarden) -> None:
    result = jw("run", "--", "no-such-program-xyz", "--flag")
    assert result.returncode == 127
    assert "command not found: no-such-program-xyz" in result.stderr
    assert "Traceback" not in result.stderr
    assert jw.json("ps", "--all") == []


def test_not_executable_fails_with_126(jw: Jobwarden, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    result = jw("run", "--", str(script))
    assert result.returncode == 126
    assert "not executable" in result.stderr


def test_timeout_ends_the_job_as_failed(jw: Jobwarden) -> None:
    result = jw("run", "--timeout", "1s", "--grace", "1s", "--wait", "--", "sleep", "600")
    assert result.returncode == 128 + signal.SIGTERM
    job_id = result.stdout.split()[0]
    status = jw.status(job_id)
    assert status["state"] == "failed"
    assert status["end_reason"] == "timeout"
    assert jw.json("explain", job_id)["findings"][0]["rule"] == "timeout"


def test_job_environment_has_markers_and_user_values_but_status_hides_them(jw: Jobwarden) -> None:
    code = (
        "import os; print(os.environ['JOBWARDEN_JOB_ID'], os.environ['JOBWARDEN_RUN'], os.environ['TOKEN'])"
    )
    result = jw("run", "--env", "TOKEN=s3cr3t-value", "--wait", "--", sys.executable, "-c", code)
    job_id = result.stdout.split()[0]
    assert jw.output(job_id).split() == [job_id, "1", "s3cr3t-value"]
    for command in (("status", job_id, "--json"), ("status", job_id), ("ps", "--all", "--json")):
        assert "s3cr3t-value" not in jw(*command).stdout


def test_state_dir_is_private(jw: Jobwarden) -> None:
    result = jw("run", "--wait", "--", "sh", "-c", "echo x")
    job_id = result.stdout.split()[0]
    assert stat.S_IMODE(jw.home.stat().st_mode) == 0o700
    assert stat.S_IMODE((jw.home / "jobwarden.db").stat().st_mode) == 0o600
    log = jw.home / "jobs" / job_id / "run-1" / "output.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600

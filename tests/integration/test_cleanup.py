"""`jobwarden rm --ended [--failed] [--older-than DUR] [--yes]` with the real CLI: the count asked on a
terminal (a real pty), refused without one, and never a job that is not over."""

from __future__ import annotations

import os
import pty
import select
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conftest import CLI_TIMEOUT_S, Jobwarden

pytestmark = pytest.mark.integration


def some_jobs(jw: Jobwarden) -> int:
    """Jobs 1-3 ended (succeeded, failed, stopped), job 4 running; returns the running one's id."""
    jw("run", "-w", "--name", "ok", "--", "true", check=True)
    assert jw("run", "-w", "--name", "bad", "--", "false").returncode == 1
    jw.start("sleep", "600", options=("--name", "halted"))
    jw("stop", "halted", check=True)
    return int(jw.start("sleep", "600", options=("--name", "live"))["id"])


def ids(jw: Jobwarden) -> list[int]:
    return [j["id"] for j in jw.json("ps", "--all")]


def on_a_terminal(jw: Jobwarden, answer: bytes, *args: str) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin and stdout; answer its question once it is asked."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", *args], env=jw.env, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    seen, answered = b"", False
    deadline = time.monotonic() + CLI_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], deadline - time.monotonic())[0]:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side closed, the command is done
                break
            if not chunk:
                break
            seen += chunk
            if not answered and seen.endswith(b"[y/N] "):
                os.write(master, answer)
                answered = True
        return proc.wait(CLI_TIMEOUT_S), seen.decode().replace("\r\n", "\n")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_without_a_terminal_rm_ended_refuses_and_removes_nothing(jw: Jobwarden) -> None:
    live = some_jobs(jw)
    try:
        result = jw("rm", "--ended")  # the fixture's stdin is /dev/null
        assert result.returncode == 2
        first, remedy = result.stderr.splitlines()
        assert first.startswith("jobwarden: rm --ended would remove 3 ended jobs (1 failed) and their logs (")
        assert first.endswith("), and there is no terminal to confirm on")
        assert remedy == "  add --yes to remove them without asking"
        assert ids(jw) == [1, 2, 3, 4]
    finally:
        jw("stop", str(live), check=True)


def test_yes_removes_every_ended_job_and_its_logs_and_never_a_live_one(jw: Jobwarden) -> None:
    live = some_jobs(jw)
    try:
        result = jw("rm", "--ended", "--yes")
        assert result.returncode == 0
        assert result.stdout.startswith("removed 3 ended jobs (1 failed) and their logs (")
        assert ids(jw) == [live]
        assert sorted(os.listdir(jw.home / "jobs")) == [str(live)]
        assert jw("rm", "--ended", "--yes").stdout == "no ended jobs to remove\n"
    finally:
        jw("stop", str(live), check=True)


def test_the_count_is_confirmed_on_a_terminal(jw: Jobwarden) -> None:
    live = some_jobs(jw)
    try:
        code, said = on_a_terminal(jw, b"n\n", "rm", "--ended", "--failed")
        assert code == 1 and "remove 1 failed job and its logs (" in said and "nothing removed" in said
        assert ids(jw) == [1, 2, 3, 4]
        code, said = on_a_terminal(jw, b"y\n", "rm", "--ended", "--failed")
        assert code == 0 and "removed 1 failed job and its logs" in said
        assert ids(jw) == [1, 3, 4]
    finally:
        jw("stop", str(live), check=True)


def test_older_than_keeps_what_ended_recently(jw: Jobwarden) -> None:
    jw("run", "-w", "--name", "old", "--", "true", check=True)
    jw("run", "-w", "--name", "new", "--", "true", check=True)
    conn = sqlite3.connect(jw.home / "jobwarden.db")
    with conn:  # job 1 ended eight days ago, as far as the store knows
        conn.execute("UPDATE runs SET ended_at = ended_at - 8 * 86400 WHERE job_id = 1")
    conn.close()
    result = jw("rm", "--ended", "--older-than", "7d", "--yes")
    assert result.returncode == 0 and result.stdout.startswith("removed 1 ended job and its logs")
    assert ids(jw) == [2]
    assert jw("rm", "--ended", "--older-than", "7d", "--yes").stdout == "no ended jobs to remove that match\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("rm", "--failed"), "jobwarden: rm --failed goes with --ended"),
        (("rm", "--older-than", "7d", "1"), "jobwarden: rm --older-than goes with --ended"),
        (("rm",), "jobwarden: rm needs a JOB, or --ended"),
        (("rm", "1", "--ended"), "jobwarden: rm: give a JOB or --ended, not both"),
        (("rm", "--ended", "--older-than", "soon"), "jobwarden: --older-than: bad duration 'soon'"),
    ],
)
def test_bad_combinations_are_one_line_errors(jw: Jobwarden, args: tuple[str, ...], message: str) -> None:
    result = jw(*args)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == message

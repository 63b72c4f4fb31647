"""The habits a newcomer brings from pm2 and pueue, with the real CLI: `status` and `logs` with no JOB
show the newest job (and say which on stderr), `stop` with no JOB refuses and lists what runs, and a typo
is answered with the nearest command or option, never with argparse's list of every choice nor a run
started without the option the user meant."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLI_TIMEOUT_S, Jobwarden, make_fifo, read_fifo, write_fifo
from tests.support import eventually

pytestmark = pytest.mark.integration


def test_status_and_logs_with_no_job_show_the_newest_and_say_so(jw: Jobwarden) -> None:
    older = jw.start("sh", "-c", "echo older", options=("--name", "older"))
    newest = jw.start("sh", "-c", "echo newest", options=("--name", "newest"))
    for job in (older, newest):
        assert jw("wait", str(job["id"])).returncode == 0

    status = jw("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["id"] == newest["id"]
    assert status.stderr == f"jobwarden status: no JOB given: job {newest['id']} (newest), the newest\n"

    logs = jw("logs")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "newest\n"  # stdout holds the job's output alone: a pipe gets nothing else
    assert logs.stderr == f"jobwarden logs: no JOB given: job {newest['id']} (newest), the newest\n"


def test_status_with_no_job_in_an_empty_home_says_there_is_none(jw: Jobwarden) -> None:
    result = jw("status")
    assert result.returncode == 1
    assert result.stderr.startswith("jobwarden: no job yet in this jobwarden home")
    assert "jobwarden run -- COMMAND" in result.stderr
    assert "Traceback" not in result.stderr


def test_stop_with_no_job_refuses_and_lists_the_running_jobs(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    waiter = "import sys; open(sys.argv[1], 'w').write('up\\n'); open(sys.argv[2]).read()"
    job = jw.start(sys.executable, "-c", waiter, str(ready), str(go), options=("--name", "waiter"))
    read_fifo(ready)

    refused = jw("stop")
    assert refused.returncode == 2
    assert "stop needs a JOB: it never guesses which job to end" in refused.stderr
    assert f"running: {job['id']} (waiter); e.g. jobwarden stop {job['id']}" in refused.stderr
    assert jw.status(job["id"])["state"] == "running"  # nothing was stopped

    write_fifo(go, "done")
    assert jw("wait", str(job["id"])).returncode == 0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("stauts",), "jobwarden: unknown command 'stauts'; did you mean status?"),
        (("--utc", "explian", "1"), "jobwarden: unknown command 'explian'; did you mean explain?"),
        (("xyzzy",), "jobwarden: unknown command 'xyzzy'\n"),
        (("logs", "--folow", "1"), "jobwarden logs: unknown option --folow; did you mean --follow?"),
        (("ps", "--lats", "3"), "jobwarden ps: unknown option --lats; did you mean --last?"),
        (("status", "1", "2"), "jobwarden status: unexpected argument 2"),
    ],
)
def test_a_typo_gets_the_nearest_word_and_no_internal_command(
    jw: Jobwarden, argv: tuple[str, ...], said: str
) -> None:
    result = jw(*argv)
    assert result.returncode == 2
    assert said in result.stderr
    assert "_jobs" not in result.stderr and "_runs" not in result.stderr
    assert "Traceback" not in result.stderr


def test_a_mistyped_run_option_starts_nothing(jw: Jobwarden, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = jw("run", "--hang-timout", "5m", "--", "touch", str(marker))
    assert result.returncode == 2
    assert "jobwarden run: unknown option --hang-timout; did you mean --hang-timeout?" in result.stderr
    assert "jobwarden run --help lists its options" in result.stderr
    assert not marker.exists()
    assert jw.json("ps", "--all", "--json") == []


def test_run_f_says_the_job_at_its_start_and_how_it_ended_at_its_end(jw: Jobwarden) -> None:
    result = jw("run", "-f", "--name", "said", "--", "sh", "-c", "echo out; exit 3")
    assert result.returncode == 3
    assert result.stdout == "out\n"
    said = result.stderr.splitlines()
    assert said[0].startswith("jobwarden: job 1 (said) started, pid ")
    assert said[0].endswith(": following its output; Ctrl-C stops following, never the job")
    assert said[-1].startswith("jobwarden: job 1 (said) failed: exit code 3")


def test_logs_f_says_how_the_job_ended(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    script = "import sys; print('hello', flush=True); open(sys.argv[1], 'w').write('up\\n'); "
    script += "open(sys.argv[2]).read()"
    job = jw.start(sys.executable, "-c", script, str(ready), str(go), options=("--name", "ends"))
    read_fifo(ready)
    follower = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "logs", "-f", str(job["id"])],
        env=jw.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "hello\n"  # handshake: it follows the job now
        write_fifo(go, "bye\n")
        out, err = follower.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0
    assert out == ""
    assert err.splitlines()[-1].startswith(f"jobwarden: job {job['id']} (ends) succeeded: exit code 0")


def test_run_on_a_terminal_says_the_job_by_id_and_name(jw: Jobwarden) -> None:
    """stdout keeps the bare id (JOB=$(jobwarden run ...)); a person at a terminal reads which job it is."""
    main, sub = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "jobwarden", "run", "--name", "told", "--", "true"],
            env=jw.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=sub,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        os.close(sub)
        sub = -1
        told = _read_all(main)
    finally:
        os.close(main)
        if sub >= 0:
            os.close(sub)
    assert proc.returncode == 0
    assert proc.stdout == "1\n"
    assert told.startswith("jobwarden: job 1 (told) started, pid ")
    assert told.rstrip().endswith(": jobwarden logs -f 1 follows it")
    assert jw("wait", "1").returncode == 0


def _read_all(fd: int) -> str:
    """What a pty's writers wrote, once all of them closed it (EIO then ends the reading, on Linux)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


TQDM_JOB = """
from tqdm import tqdm
for _ in tqdm(range(300), mininterval=0, miniters=1, ascii=True, ncols=60):
    pass
print("done", flush=True)
"""


def test_piped_logs_show_a_bars_last_frame_and_raw_every_redraw(jw: Jobwarden) -> None:
    job = jw.start(sys.executable, "-c", TQDM_JOB)
    assert jw("wait", str(job["id"])).returncode == 0

    def piped(*options: str) -> bytes:  # bytes: text mode would turn each \r into a newline
        return subprocess.run(
            [sys.executable, "-m", "jobwarden", "logs", str(job["id"]), "-n", "3", *options],
            env=jw.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CLI_TIMEOUT_S,
            check=True,
        ).stdout

    shown, raw = piped(), piped("--raw")
    lines = shown.splitlines()
    assert lines[-1] == b"done"
    assert b"\r" not in shown
    assert lines[0].startswith(b"100%|") and b"300/300" in lines[0]  # the bar as it ended, once
    assert raw.count(b"\r") > 100  # every redraw, as the job wrote it
    assert len(shown) < len(raw) / 50


def test_help_names_the_home_and_the_config_file(jw: Jobwarden) -> None:
    shown = " ".join(jw("--help", check=True).stdout.split())
    assert "JOBWARDEN_HOME is where jobs are kept (default ~/.local/state/jobwarden)" in shown
    assert "~/.config/jobwarden/config.toml" in shown
    assert "_jobs" not in shown and "_runs" not in shown


LONG_FAILURE = """
class ShardIndexOutOfRangeWhileResumingFromTheLatestCheckpointOfTheRunError(Exception):
    pass
raise ShardIndexOutOfRangeWhileResumingFromTheLatestCheckpointOfTheRunError("shard 7")
"""
BAR_THEN_WAIT = """
import sys
sys.stdout.write(" 45%|####5     | 450/1000 [00:01<00:02, 5.40it/s]")
sys.stdout.flush()
open(sys.argv[1], "w").write("up\\n")
open(sys.argv[2]).read()
"""


def test_ps_fits_a_100_column_terminal_and_wide_cuts_nothing(jw: Jobwarden, tmp_path: Path) -> None:
    from tests.integration.test_terminal_safety import in_a_terminal

    name = "a-rather-long-experiment-name-lr3e-4-bs512"
    failed = jw.start(sys.executable, "-c", LONG_FAILURE, options=("--name", name))
    assert jw("wait", str(failed["id"])).returncode == 1
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    live = jw.start(sys.executable, "-c", BAR_THEN_WAIT, str(ready), str(go), options=("--name", "bar"))
    read_fifo(ready)
    try:
        # the shim reads the bar within its next look
        eventually("progress read", lambda: jw.json("ps")[0]["progress"] is not None, 60, every_s=0.1)
        env = {**jw.env, "COLUMNS": "100"}
        shown = ANSI.sub("", in_a_terminal(env, "ps", "--all")).replace("\r\n", "\n").splitlines()
        assert len(shown) == 3, shown
        assert all(len(line) <= 100 for line in shown), shown  # no row wraps
        assert any("45%" in line for line in shown) and any("a-rather" in line for line in shown)
        title = "Uncaught ShardIndexOutOfRangeWhileResumingFromTheLatestCheckpointOfTheRunError"
        wide = ANSI.sub("", in_a_terminal(env, "ps", "--all", "--wide"))
        assert title in wide.replace("\r\n", "\n")  # --wide cuts nothing, the verdict's title included
    finally:
        write_fifo(go, "bye\n")
        jw("wait", str(live["id"]))


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_a_missing_module_is_said_missing_for_the_interpreter_that_ran(jw: Jobwarden) -> None:
    result = jw("run", "-w", "--", sys.executable, "-c", "import torch_that_is_not_there")
    assert result.returncode == 1
    (cause, *_) = jw.json("explain", "1")["findings"]
    assert cause["rule"] == "python-exception"
    assert f"not installed for the interpreter that ran the job, {sys.executable}" in cause["remedy"]
    assert f"`{sys.executable} -m pip install torch_that_is_not_there`" in cause["remedy"]

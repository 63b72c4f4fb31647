"""The habits a newcomer brings from pm2 and pueue, with the real CLI: `status` and `logs` with no JOB
show the newest job (and say which on stderr), `stop` with no JOB refuses and lists what runs, and a typo
is answered with the nearest command or option, never with argparse's list of every choice nor a run
started without the option the user meant."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo

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

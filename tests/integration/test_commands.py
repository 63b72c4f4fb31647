"""The commands around a job: logs, ps, rm, parallel launches, and bad input."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, make_fifo, processes_under, read_fifo, write_fifo

pytestmark = pytest.mark.integration
TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")


def test_logs_tail_since_and_run(jw: Jobwarden) -> None:
    result = jw("run", "--wait", "--", "sh", "-c", "for i in 1 2 3 4 5; do echo line $i; done")
    job_id = result.stdout.split()[0]
    assert jw("logs", job_id).stdout == "".join(f"line {i}\n" for i in range(1, 6))
    assert jw("logs", job_id, "-n", "2").stdout == "line 4\nline 5\n"
    assert jw("logs", job_id, "--since", "1h").stdout.count("line") == 5
    assert jw("logs", job_id, "--run", "1", "-n", "1").stdout == "line 5\n"
    missing = jw("logs", job_id, "--run", "9")
    assert missing.returncode == 1 and "no job" in missing.stderr


def test_logs_since_skips_older_output(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "3")
    read_fifo(ready)
    index = jw.home / "jobs" / str(job["id"]) / "run-1" / "output.idx"
    # make the first lines look an hour old, as the shim's index would after an hour
    index.write_text(f"{time.time() - 3600:.3f} {len(jw.output(job['id']))}\n")
    write_fifo(go, "2 0\n")
    assert jw("wait", str(job["id"])).returncode == 0
    assert jw("logs", str(job["id"]), "--since", "10m").stdout == "line 3\nline 4\n"


def test_run_follow_streams_output_until_the_end(jw: Jobwarden) -> None:
    result = jw("run", "--follow", "--wait", "--", "sh", "-c", "echo first; echo second; exit 4")
    assert result.returncode == 4
    assert result.stdout == "first\nsecond\n"


def test_logs_follow_ends_with_the_job(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "2")
    read_fifo(ready)
    follower = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "logs", "-f", str(job["id"])],
        env=jw.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        write_fifo(go, "2 0\n")
        out, _ = follower.communicate(timeout=60)
    finally:
        follower.kill()
        follower.wait()
    assert out == "".join(f"line {i}\n" for i in range(4))


def test_ps_lists_running_and_all(jw: Jobwarden, tmp_path: Path) -> None:
    jw("run", "--name", "done", "--wait", "--", "true", check=True)
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1", options=("--name", "live"))
    read_fifo(ready)
    running = jw.json("ps")
    assert [(j["name"], j["state"], j["pid"], j["run"]) for j in running] == [
        ("live", "running", job["pid"], 1)
    ]
    assert {j["name"] for j in jw.json("ps", "--all")} == {"done", "live"}
    table = jw("ps").stdout
    assert "live" in table and "running" in table and "done" not in table
    write_fifo(go, "0 0\n")
    assert jw("wait", "live").returncode == 0


def test_rm_refuses_a_running_job_and_removes_an_ended_one(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
    read_fifo(ready)
    refused = jw("rm", str(job["id"]))
    assert refused.returncode == 1
    assert "stop it first" in refused.stderr
    write_fifo(go, "0 0\n")
    jw("wait", str(job["id"]))
    assert jw("rm", str(job["id"])).returncode == 0
    assert jw.json("ps", "--all") == []
    assert not (jw.home / "jobs" / str(job["id"])).exists()


def test_hundred_simultaneous_runs_are_all_recorded(jw: Jobwarden) -> None:
    def launch(i: int) -> subprocess.CompletedProcess[str]:
        return jw("run", "--name", f"p{i}", "--", "true", timeout=180)

    with ThreadPoolExecutor(max_workers=100) as pool:
        results = list(pool.map(launch, range(100)))
    assert [r.returncode for r in results if r.returncode] == [], [r.stderr for r in results if r.returncode]
    ids = sorted(int(r.stdout) for r in results)
    assert ids == list(range(1, 101))
    for job_id in ids:
        assert jw("wait", str(job_id)).returncode == 0
    jobs = jw.json("ps", "--all")
    assert len(jobs) == 100
    assert {j["state"] for j in jobs} == {"succeeded"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "--timeout", "soon", "--", "true"), "bad duration 'soon'"),
        (("run", "--timeout=-5s", "--", "true"), "bad duration"),
        (("run", "--grace", "0", "--", "true"), "bad duration"),
        (("run", "--env", "NOEQUALS", "--", "true"), "bad --env"),
        (("run", "--"), "no command given"),
        (("status", "nosuchjob"), "no job 'nosuchjob'"),
        (("stop", "42"), "no job '42'"),
        (("logs", "--since", "yesterday", "1"), "no job"),
        (("run", "--cwd", "/nonexistent-dir", "--", "true"), "no such directory"),
    ],
)
def test_bad_input_gets_one_clear_line(jw: Jobwarden, args: tuple[str, ...], message: str) -> None:
    result = jw(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_corrupt_database_is_reported_and_kept(jw: Jobwarden) -> None:
    jw.home.mkdir(mode=0o700)
    db = jw.home / "jobwarden.db"
    garbage = b"this is not sqlite" * 100
    db.write_bytes(garbage)
    result = jw("ps")
    assert result.returncode == 1
    assert "corrupt" in result.stderr and "move it aside" in result.stderr
    assert "Traceback" not in result.stderr
    assert db.read_bytes() == garbage


def test_run_on_a_corrupt_database_starts_nothing(jw: Jobwarden, tmp_path: Path) -> None:
    """`run` forks the supervisor before it writes the store: a write that fails must take it along."""
    jw.home.mkdir(mode=0o700)
    (jw.home / "jobwarden.db").write_bytes(b"this is not sqlite" * 100)
    ran = tmp_path / "ran"
    result = jw("run", "--", "touch", str(ran))
    assert result.returncode == 1
    assert "corrupt" in result.stderr and "Traceback" not in result.stderr
    assert not ran.exists()
    assert processes_under(jw.home) == []


def test_unwritable_home_is_reported(jw: Jobwarden, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    jw.env["JOBWARDEN_HOME"] = str(blocker / "home")
    result = jw("run", "--", "true")
    assert result.returncode == 1
    assert "cannot use" in result.stderr and "JOBWARDEN_HOME" in result.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (scripts/test installs it)")
def test_job_started_in_a_tmux_pane_survives_the_pane(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    socket = str(tmp_path / "tmux.sock")
    command = f"{sys.executable} -m jobwarden run --name pane -- {sys.executable} {TICKER} {ready} {go} 3"
    tmux = ["tmux", "-S", socket]
    env = {**jw.env, "TERM": "xterm"}
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "200", "-y", "50", "sh"], env=env, check=True, timeout=30
    )
    try:
        subprocess.run([*tmux, "send-keys", command, "Enter"], env=env, check=True, timeout=30)
        pid = int(read_fifo(ready))
    finally:
        subprocess.run([*tmux, "kill-server"], env=env, timeout=30)
    write_fifo(go, "2 0\n")  # the pane and its shell are gone; the job is not
    assert jw("wait", "pane").returncode == 0
    status = jw.status("pane")
    assert (status["pid"], status["state"], status["exit_code"]) == (pid, "succeeded", 0)
    assert jw.output(status["id"]).splitlines() == [f"line {i}" for i in range(5)]

"""The edges of issue 10, Part B: each test here failed before its fix."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobwarden.store import Store
from tests.conftest import (
    Jobwarden,
    alive,
    kill_shim,
    make_fifo,
    read_fifo,
    start_time,
    wait_pid_gone,
    write_fifo,
)
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration
TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")


def test_an_env_secret_is_never_on_the_supervisors_command_line(jw: Jobwarden, tmp_path: Path) -> None:
    # /proc/PID/cmdline is readable by every local user; the shim is forked from the CLI and used to
    # keep its argv, `--env TOKEN=...` included, for the job's whole life
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    secret = "hunter2-not-for-your-eyes"
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1", options=("--env", f"TOKEN={secret}"))
    read_fifo(ready)
    try:
        shim = jw.status(job["id"])["shim_pid"]
        cmdline = Path(f"/proc/{shim}/cmdline").read_bytes()
        assert secret.encode() not in cmdline
        assert cmdline.startswith(b"jobwarden shim")
        assert secret not in jw("status", str(job["id"])).stdout
    finally:
        write_fifo(go, "0 0\n")
    assert jw("wait", str(job["id"])).returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "--timeout", "ten minutes", "--", "true"), "--timeout: bad duration 'ten minutes'"),
        (("run", "--grace", "soon", "--", "true"), "--grace: bad duration 'soon'"),
        (("run", "--hang-timeout", "1x", "--", "true"), "--hang-timeout: bad duration '1x'"),
        (("run", "--timeout", "400d", "--", "true"), "--timeout: duration '400d' is longer than"),
        (("run", "--mem-limit", "16EiB", "--", "true"), "--mem-limit: bad size '16EiB'"),
        (("run", "--mem-limit", "17179869184G", "--", "true"), "--mem-limit: size '17179869184G' is beyond"),
        (("run", "--name", "2", "--", "true"), "a name of digits would read as a job id"),
        (("run", "--name", "a\nb", "--", "true"), "a name must be printable"),
        (("run", "--name", "\x1b[31mred", "--", "true"), "a name must be printable"),
        (("run", "--name", "x" * 100_000, "--", "true"), "--name 'xxxxxxxxxxxxxxxxxxxx'...: 100000"),
        (("stop", "--grace", "forever", "1"), "--grace: bad duration 'forever'"),
        (("wait", "--timeout", "x", "1"), "--timeout: bad duration 'x'"),
    ],
)
def test_a_bad_value_is_named_by_its_option(jw: Jobwarden, args: tuple[str, ...], message: str) -> None:
    result = jw(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert jw.json("ps", "--all") == []  # nothing was started


def test_a_default_name_is_printable_and_never_an_id(jw: Jobwarden, tmp_path: Path) -> None:
    odd = tmp_path / "7"
    odd.write_text("#!/bin/sh\n")
    odd.chmod(0o755)
    job = jw.start(str(odd))
    assert job["name"] == "job-7"
    assert jw("wait", str(job["id"])).returncode == 0


def test_stop_with_a_grace_of_weeks_ends_a_job_without_a_traceback(jw: Jobwarden, tmp_path: Path) -> None:
    # 25 days of milliseconds overflowed poll(2)'s int: the CLI crashed after the job had been signalled
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
    read_fifo(ready)
    result = jw("stop", "--grace", "25d", str(job["id"]))
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stderr
    assert jw.status(job["id"])["state"] == "stopped"


@pytest.mark.needs_root
def test_a_home_owned_by_another_user_is_refused(jw: Jobwarden) -> None:
    if os.geteuid() != 0:
        unavailable("only root can give a directory to another user")
    jw.home.mkdir(mode=0o700)
    os.chown(jw.home, 65534, 65534)
    result = jw("run", "--", "true")
    assert result.returncode != 0
    assert "belongs to uid 65534, not to you" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (jw.home / "jobs").exists()


@pytest.mark.needs_root
def test_a_symlink_to_another_users_directory_is_refused(jw: Jobwarden, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("only root can give a directory to another user")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    jw.home.symlink_to(theirs)
    result = jw("ps")
    assert "belongs to uid 65534" in result.stderr and result.returncode != 0


@pytest.mark.needs_root
def test_orphans_kill_spares_another_users_process_that_merely_carries_the_marker(jw: Jobwarden) -> None:
    if os.geteuid() != 0:
        unavailable("only root can start a process as another user")
    job = jw.start("true")
    assert jw("wait", str(job["id"])).returncode == 0
    marker = {"JOBWARDEN_HOME": str(jw.home), "JOBWARDEN_JOB_ID": str(job["id"]), "JOBWARDEN_RUN": "1"}
    bystander = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sleep", "3600"],
        env={"PATH": os.environ["PATH"], **marker},
    )
    try:
        assert jw.json("orphans") == []
        assert jw("orphans", "--kill", "--grace", "1s").returncode == 0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_ids_are_never_reused_after_the_database_is_moved_aside(jw: Jobwarden) -> None:
    # the advice for a corrupt database is to move it aside: the new one must not hand out id 1 again,
    # or job 1 appends to the old job 1's log and `rm 1` deletes it
    old = jw.start("sh", "-c", "echo old output")
    assert jw("wait", str(old["id"])).returncode == 0
    for suffix in ("", "-wal", "-shm"):
        db = jw.home / f"jobwarden.db{suffix}"
        if db.exists():
            db.rename(jw.home / f"aside.db{suffix}")
    new = jw.start("sh", "-c", "echo new output")
    assert new["id"] == old["id"] + 1
    assert jw("wait", str(new["id"])).returncode == 0
    assert jw("rm", str(new["id"])).returncode == 0
    assert jw.output(old["id"]) == "old output\n"


@pytest.mark.parametrize("delay_ms", [0, 1, 2, 5, 10, 20, 50])
def test_ctrl_c_during_run_never_prints_a_traceback_nor_leaves_a_ghost(jw: Jobwarden, delay_ms: int) -> None:
    # the terminal's Ctrl-C reaches the whole foreground group: the CLI, and its shim until setsid().
    # It is sent once the shim is forked (before that it meets the interpreter's own start-up, whose
    # KeyboardInterrupt traceback no program can catch), at moments through the handover.
    cli = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "run", "--", "true"],
        env=jw.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    children = Path(f"/proc/{cli.pid}/task/{cli.pid}/children")
    eventually(  # busy-polled (every_s=0): the window after the fork is milliseconds long
        "the CLI forked, or ended",
        lambda: cli.poll() is not None or children.read_text().strip(),
        60,
        every_s=0,
    )
    time.sleep(delay_ms / 1000)  # not a wait for anything: the moment the signal is injected
    with contextlib.suppress(ProcessLookupError):
        os.killpg(cli.pid, signal.SIGINT)
    out, err = cli.communicate(timeout=60)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    for job in jw.json("ps", "--all"):
        final = jw.json("wait", str(job["id"]))  # never a ghost: every recorded job ends
        assert final["state"] in ("succeeded", "failed"), final
        if cli.returncode == 0:
            assert out.strip() == str(job["id"])  # it ran: its id was printed
        elif final["state"] == "succeeded":
            assert f"job {job['id']} was handed to its supervisor and runs on" in err


@pytest.mark.parametrize(
    "args",
    [
        ("status", "99999999999999999999"),
        ("stop", "18446744073709551616"),
        ("explain", "9223372036854775808"),
        ("logs", "--run", "99999999999999999999", "1"),
        ("status", "--run", "-1", "1"),
    ],
)
def test_a_number_past_sqlites_integers_names_no_job(jw: Jobwarden, args: tuple[str, ...]) -> None:
    jw("run", "--wait", "--", "true", check=True)
    result = jw(*args)
    assert result.returncode == 1
    assert "no job" in result.stderr and "Traceback" not in result.stderr


def test_a_working_directory_that_is_not_utf8_runs_and_is_shown(jw: Jobwarden, tmp_path: Path) -> None:
    odd = os.fsdecode(bytes(tmp_path) + b"/caf\xe9")  # a Latin-1 name
    os.mkdir(odd)
    result = jw("run", "--wait", "--cwd", odd, "--", "pwd")
    assert result.returncode == 0, result.stderr
    job = int(result.stdout)
    assert (jw.home / "jobs" / str(job) / "run-1" / "output.log").read_bytes() == os.fsencode(odd) + b"\n"
    assert jw.status(job)["cwd"] == odd
    shown = subprocess.run(
        [sys.executable, "-m", "jobwarden", "status", str(job)], env=jw.env, capture_output=True, timeout=60
    )
    assert shown.returncode == 0 and b"Traceback" not in shown.stderr
    assert os.fsencode(odd) in shown.stdout


def test_logs_since_reads_past_a_damaged_index(jw: Jobwarden) -> None:
    job = jw.start("sh", "-c", "echo kept")
    assert jw("wait", str(job["id"])).returncode == 0
    index = jw.home / "jobs" / str(job["id"]) / "run-1" / "output.idx"
    with index.open("ab") as fh:
        fh.write(b"garbage\n\xff\xfe 12\n1e999 5\nnan nan\n12")  # torn and foreign lines
    result = jw("logs", "--since", "1h", str(job["id"]))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert result.stdout == "kept\n"


def test_notify_leaves_no_ignored_exception_in_the_supervisors_log(jw: Jobwarden) -> None:
    # the --on-event command's SIGCHLD reached a closed signal wakeup fd after the supervisor closed it
    for _ in range(3):
        result = jw("run", "--wait", "--on-event", "cat > /dev/null", "--", "sh", "-c", "exit 3")
        assert result.returncode == 3
    for log in (jw.home / "jobs").glob("*/run-1/shim.log"):
        assert "Exception ignored" not in log.read_text()


def test_stop_of_a_job_still_starting_stops_it(jw: Jobwarden) -> None:
    # for a few milliseconds a new job has no supervisor on record: stop used to fail an assertion
    import sqlite3

    for attempt in range(8):
        cli = subprocess.Popen(
            [sys.executable, "-m", "jobwarden", "run", "--", "sleep", "300"],
            env=jw.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        job_id = attempt + 1

        def recorded(job_id: int = job_id) -> bool:
            with contextlib.suppress(sqlite3.Error):
                db = sqlite3.connect(f"file:{jw.home / 'jobwarden.db'}?mode=ro", uri=True)
                try:
                    return db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None
                finally:
                    db.close()
            return False

        eventually(f"job {job_id} recorded", recorded, 60, every_s=0)  # the moment the job's record exists
        stopped = jw("stop", "--grace", "5s", str(job_id))
        assert "Traceback" not in stopped.stderr, stopped.stderr
        assert stopped.returncode == 0, stopped.stderr
        cli.communicate(timeout=60)
        assert jw.status(job_id)["state"] in ("stopped", "failed")


def _term_ignoring_job(jw: Jobwarden, tmp_path: Path) -> dict[str, Any]:
    ready = make_fifo(tmp_path / "ready")
    job = jw.start("sh", "-c", f'trap "" TERM; echo up > {ready}; while :; do sleep 0.2; done')
    read_fifo(ready)
    return job


def _patient_stop(jw: Jobwarden, job: dict[str, Any]) -> subprocess.Popen[str]:
    """`stop --grace 1h` in the background, returned once it is waiting out its grace."""
    patient = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "stop", "--grace", "1h", str(job["id"])],
        env=jw.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually("the stop began", lambda: jw.status(job["id"])["state"] == "stopping", 60, every_s=0)
    except BaseException:  # pytest.fail's outcome too
        patient.kill()
        patient.wait()
        raise
    return patient


def test_a_second_stop_with_force_cuts_a_long_grace_short(jw: Jobwarden, tmp_path: Path) -> None:
    job = _term_ignoring_job(jw, tmp_path)
    patient = _patient_stop(jw, job)
    try:
        forced = jw("stop", "--force", str(job["id"]), timeout=60)
        assert forced.returncode == 0, forced.stderr
        status = jw.status(job["id"])
        assert (status["state"], status["signal"]) == ("stopped", "SIGKILL")
        _, err = patient.communicate(timeout=60)
        assert patient.returncode == 0 and "Traceback" not in err
    finally:
        patient.kill()
        patient.wait()


def test_force_and_grace_exclude_each_other(jw: Jobwarden) -> None:
    result = jw("stop", "--force", "--grace", "5s", "1")
    assert result.returncode == 2 and "--force and --grace exclude each other" in result.stderr


def test_ps_fits_the_terminal_width(jw: Jobwarden) -> None:
    jw("run", "--wait", "--", "sh", "-c", "true " + "padding " * 40, check=True)
    jw.env["COLUMNS"] = "72"
    lines = jw("ps", "--all", check=True).stdout.splitlines()
    assert len(lines) == 2 and all(len(line) <= 72 for line in lines)
    assert lines[1].endswith("…")


def test_verbose_says_what_run_and_stop_do(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    started = jw("-v", "run", "--", sys.executable, TICKER, str(ready), str(go), "1", check=True)
    assert "recorded (starting); handing it to supervisor pid" in started.stderr
    read_fifo(ready)
    stopped = jw("-vv", "stop", started.stdout.strip(), check=True)
    assert "store: " in stopped.stderr and "to stop job" in stopped.stderr
    # without -v, only the line that says how the waited-for job ended
    assert jw("run", "--wait", "--", "true").stderr.startswith("jobwarden: job 2 (true) succeeded")
    quiet = jw("run", "--", "true")
    assert quiet.stderr == ""  # and nothing at all without --wait
    assert jw("wait", quiet.stdout.strip()).returncode == 0


def test_stop_never_says_success_over_a_job_whose_supervisor_died_mid_stop(
    jw: Jobwarden, tmp_path: Path
) -> None:
    job = _term_ignoring_job(jw, tmp_path)
    job_start = start_time(job["pid"])
    assert job_start is not None
    patient = _patient_stop(jw, job)
    try:
        first_shim = kill_shim(jw, job["id"])  # its supervisor dies while waiting out the grace

        def stopping_again() -> bool:  # the stop takes the job over with a new supervisor and asks again
            status = jw.status(job["id"])
            return status["shim_pid"] != first_shim and status["state"] == "stopping"

        eventually("stopped again by a new supervisor", stopping_again, 60, every_s=0)
        assert alive(job["pid"], job_start)
        assert jw("stop", "--force", str(job["id"])).returncode == 0
        _, err = patient.communicate(timeout=60)
        assert patient.returncode == 0, err
        assert not alive(job["pid"], job_start)  # success, and it is true
    finally:
        patient.kill()
        patient.wait()


def test_stop_resumes_a_stopped_supervisor_and_says_so(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
    read_fifo(ready)
    shim = jw.status(job["id"])["shim_pid"]
    os.kill(shim, signal.SIGSTOP)  # Ctrl-Z, or a debugger's stop: it cannot act on a request
    begun = time.monotonic()
    stopped = jw("stop", "--grace", "5s", str(job["id"]), timeout=25)
    assert stopped.returncode == 0, stopped.stderr
    assert "was stopped (SIGSTOP): resumed it with SIGCONT" in stopped.stdout
    assert time.monotonic() - begun < 20  # within the grace and its margin, not after 35 s
    assert jw.status(job["id"])["state"] == "stopped"


def test_a_shim_of_a_database_moved_aside_never_takes_the_new_databases_job(
    jw: Jobwarden, tmp_path: Path
) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    old = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
    read_fifo(ready)
    old_shim = jw.status(old["id"])["shim_pid"]
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("jobwarden.db", "jobwarden.db-wal", "jobwarden.db-shm", "jobs"):
        if (jw.home / name).exists():  # everything of the old database: job ids start over
            (jw.home / name).rename(aside / name)
    new = jw.start("sleep", "300")
    assert (new["id"], new["pid"]) == (old["id"], new["pid"])  # the same job id and run: the same marks
    new_start = start_time(new["pid"])
    write_fifo(go, "0 0\n")  # the old job ends: its shim ends what it finds of its tree, marks included
    wait_pid_gone(old_shim)
    assert alive(new["pid"], new_start), "the old database's shim ended the new database's job"
    assert jw.json("stop", str(new["id"]))["state"] == "stopped"


def test_deleting_the_write_ahead_log_while_a_supervisor_runs_loses_no_record(
    jw: Jobwarden, tmp_path: Path
) -> None:
    ended = jw.start("true")["id"]
    assert jw("wait", str(ended)).returncode == 0  # its records sit in the log, not checkpointed yet
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    live = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
    read_fifo(ready)
    (jw.home / "jobwarden.db-wal").unlink()
    listed = jw("ps", "--all", "--json")  # waits for the supervisor to let go of the deleted log
    assert listed.returncode == 0, listed.stderr
    jobs = {j["id"]: j["state"] for j in json.loads(listed.stdout)}
    assert jobs == {ended: "succeeded", live["id"]: "running"}
    write_fifo(go, "0 0\n")
    assert jw("wait", str(live["id"])).returncode == 0
    assert jw.status(live["id"])["state"] == "succeeded"
    with Store(jw.home) as store:
        kinds = [e.kind for e in store.events(live["id"], 1)]
    assert "store-reopened" in kinds and "ended" in kinds

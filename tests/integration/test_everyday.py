"""Everyday habits with the real CLI (issue 21): how `run -f`/`-w` and `wait` end and exit, `@last`, a name
shared by live jobs, `rerun`, the config file and its precedence, `--max-restarts unlimited`, GPUs on a
machine without any."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from jobwarden.probes.gpu import nvidia_driver_present
from tests.conftest import Jobwarden, make_fifo, read_fifo

pytestmark = pytest.mark.integration


def stored_job(jw: Jobwarden, job_id: int) -> dict[str, Any]:
    """The job's row as stored: command, cwd, --env values and options (what `rerun` must keep)."""
    conn = sqlite3.connect(f"file:{jw.home / 'jobwarden.db'}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT name, command, cwd, env, options, rerun_of FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
    finally:
        conn.close()
    name, command, cwd, env, options, rerun_of = row
    return {
        "name": name,
        "command": json.loads(command),
        "cwd": cwd,
        "env": json.loads(env),
        "options": json.loads(options),
        "rerun_of": rerun_of,
    }


def write_config(jw: Jobwarden, text: str) -> Path:
    path = Path(jw.env["XDG_CONFIG_HOME"]) / "jobwarden" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


# --- how a waited-for job ended ------------------------------------------------------------------------


def test_run_follow_exits_with_the_jobs_status_and_says_how_it_ended(jw: Jobwarden) -> None:
    result = jw("run", "-f", "--name", "step", "--", "sh", "-c", "echo out; exit 3")
    assert result.returncode == 3  # -f alone: the job's status, not 0
    assert result.stdout == "out\n"  # stdout is the job's alone
    last = result.stderr.splitlines()[-1]
    assert last.startswith("jobwarden: job 1 (step) failed: exit code 3 after ")
    assert last.endswith("; why: jobwarden explain 1")


def test_run_wait_says_a_signal_death_and_exits_128_plus_n(jw: Jobwarden) -> None:
    result = jw("run", "-w", "--", "sh", "-c", "kill -KILL $$")
    assert result.returncode == 137
    assert result.stdout == "1\n"
    assert "(sh) failed: killed by SIGKILL after" in result.stderr.splitlines()[-1]


def test_a_success_is_said_without_a_remedy(jw: Jobwarden) -> None:
    result = jw("run", "-w", "--name", "ok", "--", "true")
    assert result.returncode == 0
    assert result.stderr.splitlines()[-1].startswith("jobwarden: job 1 (ok) succeeded: exit code 0 after")
    assert "explain" not in result.stderr


def test_wait_timeout_exits_124_and_a_missing_job_125(jw: Jobwarden) -> None:
    job = jw.start("sleep", "600")
    try:
        result = jw("wait", str(job["id"]), "--timeout", "0.2s")
        assert result.returncode == 124  # as timeout(1)
        assert result.stderr.strip() == f"jobwarden: job {job['id']} is still running after 0s"
        assert jw.status(job["id"])["state"] == "running"  # waiting never touches the job
        as_json = jw("wait", str(job["id"]), "--timeout", "0.2s", "--json")
        assert as_json.returncode == 124 and json.loads(as_json.stdout)["state"] == "running"
    finally:
        jw("stop", str(job["id"]), check=True)
    missing = jw("wait", "nosuchjob")
    assert missing.returncode == 125
    assert missing.stderr.splitlines()[0] == "jobwarden: no job 'nosuchjob'"
    ended = jw("wait", str(job["id"]))
    assert ended.returncode == 128 + 15  # stopped: SIGTERM
    assert "stopped: killed by SIGTERM" in ended.stderr


# --- naming a job ---------------------------------------------------------------------------------------


def test_at_last_names_the_newest_job_in_every_command(jw: Jobwarden) -> None:
    assert jw("status", "@last").stderr.startswith("jobwarden: no job yet in this jobwarden home")
    jw("run", "-w", "--name", "first", "--", "echo", "one", check=True)
    jw("run", "-w", "--name", "second", "--", "echo", "two", check=True)
    assert jw.json("status", "@last")["name"] == "second"
    assert jw("logs", "@last").stdout == "two\n"
    assert jw.json("explain", "@last")["id"] == 2
    assert jw("wait", "@last").returncode == 0
    refused = jw("run", "--name", "@mine", "--", "true")
    assert refused.returncode == 2 and "must not start with '@'" in refused.stderr


def test_a_name_shared_by_live_jobs_is_said_at_run_and_where_it_is_used(jw: Jobwarden) -> None:
    jw("run", "-w", "--name", "train", "--", "true", check=True)
    older = jw("run", "--name", "train", "--", "sleep", "600")
    assert "note" not in older.stderr  # the earlier `train` has ended: reusing its name is the habit
    newer = jw("run", "--name", "train", "--", "sleep", "600")
    try:
        assert newer.stderr.strip() == (
            "jobwarden: note: 'train' also names job 2, not over yet; 'train' now means the newest, "
            "reach the older by id"
        )
        status = jw("status", "train")
        assert status.stdout.startswith("job 3 (train)")
        assert status.stderr.strip() == (
            "jobwarden: note: 'train' names job 3, the newest of that name; older job 2 of that name is not "
            "over yet (give an id to mean one of them)"
        )
        assert jw("status", "3").stderr == ""  # an id is never ambiguous
    finally:
        jw("stop", "2", check=True)
        jw("stop", "3", check=True)
    assert jw("status", "train").stderr == ""  # over: no longer worth a word


# --- rerun ----------------------------------------------------------------------------------------------


def test_rerun_repeats_command_cwd_env_and_every_option_and_says_where_it_came_from(
    jw: Jobwarden, tmp_path: Path
) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    options = (
        "--name", "sweep", "--cwd", str(work), "--env", "LR=3e-4", "--env", "TOKEN=s3cret",
        "--timeout", "1h", "--grace", "3s", "--hang-timeout", "30m", "--on-hang", "stop",
        "--restart", "on-failure", "--max-restarts", "2", "--restart-delay", "2s", "--mem-limit", "2G",
        "--mp-start", "spawn", "--no-py-hooks", "--notify", "https://example.com/hook",
        "--on-event", "true", "--log-max", "1G", "--keep-running", "tensorboard", "--queue", "sweeps",
    )  # fmt: skip
    first = jw("run", "-w", *options, "--", "sh", "-c", 'echo "$LR $TOKEN $(pwd)"; exit 0')
    assert first.returncode == 0, first.stderr
    again = jw("rerun", "1", "--json", "-w")
    assert again.returncode == 0, again.stderr
    answer = json.loads(again.stdout)
    assert answer["id"] == 2 and answer["rerun_of"] == 1 and answer["name"] == "sweep"
    old, new = stored_job(jw, 1), stored_job(jw, 2)
    assert new["rerun_of"] == 1 and old["rerun_of"] is None
    for key in ("name", "command", "cwd", "env", "options"):
        assert new[key] == old[key], key
    assert new["env"] == {"LR": "3e-4", "TOKEN": "s3cret"}
    assert jw.output(2) == jw.output(1) == f"3e-4 s3cret {work}\n"
    status = jw.status(2)
    assert status["rerun_of"] == 1 and "s3cret" not in json.dumps(status)  # values are never shown
    assert "  rerun of     job 1" in jw("status", "2").stdout.splitlines()
    said = jw("rerun", "@last")
    assert said.stderr.startswith("jobwarden: job 3 reruns job 2 (sweep)")
    assert jw("wait", "3").returncode == 0


def test_rerun_of_a_job_whose_directory_is_gone_says_so(jw: Jobwarden, tmp_path: Path) -> None:
    work = tmp_path / "gone"
    work.mkdir()
    jw("run", "-w", "--cwd", str(work), "--", "true", check=True)
    work.rmdir()
    result = jw("rerun", "1")
    assert result.returncode == 2
    assert (
        result.stderr.splitlines()[0]
        == f"jobwarden: cannot rerun job 1: its working directory {work} is gone"
    )


# --- the config file ------------------------------------------------------------------------------------


def test_the_config_file_sets_runs_defaults_and_a_flag_overrides_it(jw: Jobwarden) -> None:
    write_config(
        jw,
        "# defaults for every run\n"
        "[run]\n"
        'hang_timeout = "30m"\n'
        'restart = "on-failure"\n'
        "max_restarts = 2\n"
        'log_max = "1G"\n'
        'keep_running = "tensorboard"\n'
        'notify = "https://hooks.slack.com/services/T0/B0/secret"\n'
        "[web]\n"
        'url = "http://gpu-box:8765"\n',
    )
    jw("run", "-w", "--", "true", check=True)
    from_file = stored_job(jw, 1)["options"]
    assert from_file["hang_timeout_s"] == 1800 and from_file["restart"] == "on-failure"
    assert from_file["max_restarts"] == 2 and from_file["log_max_bytes"] == 1 << 30
    assert from_file["keep_running"] == ["tensorboard"]
    assert from_file["notify"] == "https://hooks.slack.com/services/T0/B0/secret"
    assert from_file["web_url"] == "http://gpu-box:8765"
    flags = ("--hang-timeout", "5m", "--restart", "no", "--log-max", "off", "--keep-running", "other")
    jw("run", "-w", *flags, "--", "true", check=True)
    overridden = stored_job(jw, 2)["options"]
    assert overridden["hang_timeout_s"] == 300 and overridden["log_max_bytes"] == 0
    # --restart given: the file's restart and max_restarts are one setting, the flag's
    assert overridden["restart"] == "no" and overridden["max_restarts"] == 3
    assert overridden["keep_running"] == ["other"]
    assert overridden["notify"] == from_file["notify"]  # not given: still the file's


def test_doctor_shows_the_config_file_in_force_and_what_it_sets(jw: Jobwarden) -> None:
    report = jw.json("doctor")
    check = next(c for c in report["checks"] if c["name"] == "config file")
    assert check["status"] == "ok" and "none at" in check["message"]
    path = write_config(
        jw, '[run]\nhang_timeout = "30m"\nnotify = "https://hooks.slack.com/services/T/B/key"\n'
    )
    check = next(c for c in jw.json("doctor")["checks"] if c["name"] == "config file")
    assert check["message"] == (
        f"{path} sets hang_timeout = 30m; notify = https://hooks.slack.com/… (a flag given to `run` wins)"
    )
    assert "key" not in json.dumps(check)  # a webhook's path is its secret


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[run]\nhang_timeout = "ten"\n', "line 2: hang_timeout: bad duration 'ten'"),
        ('[run]\nrestart = "on-failure"\nhang-timeout = "5m"\n', "line 3: hang-timeout: unknown key"),
        ("[run]\nmax_restarts = 2.5\n", "line 2: max_restarts: 2.5 is not a whole number"),
        ('[run]\non_hang = "kill"\n', "line 2: on_hang: bad value 'kill'"),
        ('[runn]\nrestart = "no"\n', "line 1: runn: unknown table"),
        ("[run\n", ": not valid TOML: "),
    ],
)
def test_a_bad_config_file_names_the_file_line_and_key_and_nothing_starts(
    jw: Jobwarden, text: str, message: str
) -> None:
    path = write_config(jw, text)
    result = jw("run", "--", "true")
    assert result.returncode == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"jobwarden: config file {path}") and message in first
    assert "Traceback" not in result.stderr
    assert not (jw.home / "jobwarden.db").exists()
    doctor = jw("doctor", "--json")
    assert doctor.returncode == 1  # a failed check
    check = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "config file")
    assert check["status"] == "fail" and message in check["message"]


def test_a_config_file_others_may_write_is_refused(jw: Jobwarden) -> None:
    path = write_config(jw, '[run]\non_event = "true"\n')
    path.chmod(0o666)
    result = jw("run", "--", "true")
    assert result.returncode == 2
    assert "other users may write it (mode 0666), and it can run commands" in result.stderr
    assert f"chmod go-w {path}" in result.stderr


# --- restarts without end, GPUs that are not there --------------------------------------------------------


def test_max_restarts_unlimited_keeps_a_service_up_past_the_default_count(
    jw: Jobwarden, tmp_path: Path
) -> None:
    beats = make_fifo(tmp_path / "beats")
    script = f'echo "$JOBWARDEN_RUN" > {beats}; exit 1'
    job = jw.start(
        "sh", "-c", script,
        options=("--restart", "always", "--max-restarts", "unlimited", "--restart-delay", "0.01s"),
    )  # fmt: skip
    try:
        runs = [int(read_fifo(beats)) for _ in range(6)]  # the default would stop after run 4
        assert runs == [1, 2, 3, 4, 5, 6]
    finally:
        jw("stop", str(job["id"]), check=True)
    status = jw.status(job["id"])
    assert status["state"] == "stopped" and status["run"] >= 6


def test_gpus_on_a_machine_without_any_are_refused_and_never_listed(jw: Jobwarden) -> None:
    if nvidia_driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    result = jw("run", "--gpus", "1", "--", "true")
    assert result.returncode == 2
    first, remedy = result.stderr.splitlines()[:2]
    assert first.startswith("jobwarden: --gpus: this machine has no GPUs: no NVIDIA driver (")
    assert "pynvml" not in result.stderr and "without --gpus" in remedy
    assert jw("ps", "--all").stdout.startswith("no jobs")


def test_a_gpu_request_that_can_be_met_later_still_waits_queued(jw: Jobwarden, tmp_path: Path) -> None:
    """Refusing what can never be met leaves alone what is only busy (NVML is the fake one: its one GPU
    is held by another process): queued, until stopped."""
    from jobwarden.probes import fakenvml

    state = tmp_path / "nvml.json"
    gpu = fakenvml.device(0)
    gpu["compute"] = [{"pid": 1, "used_memory": 4 << 30}]
    fakenvml.write_state(state, {"devices": [gpu]})
    jw.env[fakenvml.FAKE_NVML_ENV] = str(state)
    job = jw.start("true", options=("--gpus", "1"))
    assert job["state"] == "queued"
    jw("stop", str(job["id"]), check=True)
    assert jw.status(job["id"])["state"] == "stopped"

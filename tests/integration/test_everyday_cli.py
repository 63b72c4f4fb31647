"""Everyday command-line habits, part B of issue 21, with the real CLI: `logs -f` from the tail and of several
jobs at once, one time zone and --utc, what `status` says a job runs under, `ps`'s columns and filters."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import CLI_TIMEOUT_S, Jobwarden, make_fifo, read_fifo, write_fifo
from tests.integration.test_terminal_safety import HOSTILE, RED, assert_clean, in_a_terminal
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration

# prints N numbered lines, says it is ready, waits for a word on the go FIFO, prints it and ends
PRINTER = """
import sys
import time
ready, go, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
for i in range(n):
    print(f"{tag} {i}", flush=True)
open(ready, "w").write("ready\\n")
print(open(go).read().strip(), flush=True)
"""


def start_printer(jw: Jobwarden, tmp: Path, n: int, tag: str) -> tuple[str, Path]:
    ready, go = make_fifo(tmp / f"ready-{tag}"), make_fifo(tmp / f"go-{tag}")
    job = jw.start(sys.executable, "-c", PRINTER, str(ready), str(go), str(n), tag, options=("--name", tag))
    read_fifo(ready)
    return str(job["id"]), go


def follower(jw: Jobwarden, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "logs", *args],
        env=jw.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_until(stream: IO[str], last: str) -> list[str]:
    """The follower's lines up to and with the one that ends with `last` (its handshake: it has read the
    tail, so what the job writes next is followed)."""
    lines: list[str] = []
    while True:
        line = stream.readline()
        assert line, f"the follower ended before {last!r}: {lines}"
        lines.append(line.rstrip("\n"))
        if line.rstrip("\n").endswith(last):
            return lines


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()


# --- logs -f, -n ---------------------------------------------------------------------------------------


def test_logs_follow_starts_at_the_last_ten_lines_then_follows(jw: Jobwarden, tmp_path: Path) -> None:
    job, go = start_printer(jw, tmp_path, 25, "line")
    proc = follower(jw, "-f", job)
    assert proc.stdout is not None
    first = read_until(proc.stdout, "line 24")
    assert first == [f"line {i}" for i in range(15, 25)]  # the tail, as tail -f
    write_fifo(go, "after\n")
    rest, err = finish(proc)
    assert proc.returncode == 0, err
    assert rest == "after\n"  # followed from where the tail ended: nothing lost, nothing twice


def test_logs_n_all_follows_from_the_start_and_n_counts(jw: Jobwarden, tmp_path: Path) -> None:
    job, go = start_printer(jw, tmp_path, 25, "line")
    proc = follower(jw, "-f", "-n", "all", job)
    assert proc.stdout is not None
    assert read_until(proc.stdout, "line 24") == [f"line {i}" for i in range(25)]
    write_fifo(go, "after\n")
    rest, _ = finish(proc)
    assert rest == "after\n"
    assert jw("logs", "-n", "3", job).stdout == "line 23\nline 24\nafter\n"
    assert jw("logs", "-n", "0", job).stdout == ""
    assert jw("logs", "-n", "ALL", job).stdout.count("\n") == 26
    assert jw("logs", job).stdout.count("\n") == 26  # without -f, every line as before


# run 1 says it is ready, prints the word it is sent and fails; run 2 (the restart) prints and ends
RESTARTER = """
import os
import sys
ready, go = sys.argv[1], sys.argv[2]
run = os.environ["JOBWARDEN_RUN"]
print(f"run {run} starts", flush=True)
if run == "1":
    open(ready, "w").write("ready\\n")
    print(open(go).read().strip(), flush=True)
    sys.exit(3)
print("run 2 ends", flush=True)
"""


@pytest.mark.parametrize("how", ["logs -f", "run -f", "logs -f of two jobs"])
def test_following_a_job_that_restarts_goes_on_into_its_next_run(
    jw: Jobwarden, tmp_path: Path, how: str
) -> None:
    """As `pm2 logs` does: the restart's output follows run 1's, with a line on stderr that says so;
    `--run 1` follows that run only."""
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    options = ("--name", "flaky", "--restart", "on-failure", "--max-restarts", "1", "--restart-delay", "0.2s")
    command = (sys.executable, "-c", RESTARTER, str(ready), str(go))
    if how == "run -f":
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobwarden", "run", "-f", *options, "--", *command],
            env=jw.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        read_fifo(ready)
        pinned = None
    else:
        job = str(jw.start(*command, options=options)["id"])
        read_fifo(ready)
        others = [str(jw.start("true")["id"])] if how == "logs -f of two jobs" else []
        proc = follower(jw, "-f", job, *others)
        pinned = follower(jw, "-f", "--run", "1", job)
    try:
        assert proc.stdout is not None
        prefix = "1 flaky | " if how == "logs -f of two jobs" else ""
        assert read_until(proc.stdout, "run 1 starts") == [f"{prefix}run 1 starts"]
        write_fifo(go, "run 1 fails\n")
        out, err = finish(proc)
        assert proc.returncode == 0, err
        shown = "".join(f"{prefix}{line}\n" for line in ("run 1 fails", "run 2 starts", "run 2 ends"))
        assert out == shown, err
        assert "jobwarden: job " in err and " started run 2; following its output" in err, err
        if pinned is not None:
            pinned_out, pinned_err = finish(pinned)
            assert pinned_out == "run 1 starts\nrun 1 fails\n" and "run 2" not in pinned_err
    finally:
        for follows in (proc, pinned):
            if follows is not None:
                finish(follows)  # reaped whatever happened (finish kills one still running)


@pytest.mark.parametrize("value", ["-5", "+5", "five", "1.5", ""])
def test_logs_refuses_a_bad_line_count_naming_n(jw: Jobwarden, value: str) -> None:
    jw("run", "-w", "--", "echo", "hi", check=True)
    result = jw("logs", "-n", value, "1")
    assert result.returncode == 2
    assert result.stdout == ""
    first = result.stderr.splitlines()[0]
    assert first.startswith("jobwarden: -n: bad line count"), result.stderr
    assert "Traceback" not in result.stderr and "all" in result.stderr


def test_logs_follows_several_jobs_each_line_prefixed(jw: Jobwarden, tmp_path: Path) -> None:
    a, go_a = start_printer(jw, tmp_path, 12, "alpha")
    b, go_b = start_printer(jw, tmp_path, 3, "b")
    proc = follower(jw, "-f", a, b)
    assert proc.stdout is not None
    shown = read_until(proc.stdout, "b 2")  # each job's tail, job after job
    pa, pb = f"{a} alpha |", f"{b} b     |"  # one width: the lines start in one column
    assert shown == [f"{pa} alpha {i}" for i in range(2, 12)] + [f"{pb} b {i}" for i in range(3)]
    write_fifo(go_b, "b ends first\n")
    assert read_until(proc.stdout, "b ends first") == [f"{pb} b ends first"]
    write_fifo(go_a, "alpha ends\n")
    rest, err = finish(proc)  # ends once both have
    assert proc.returncode == 0, err
    assert rest == f"{pa} alpha ends\n"
    both = jw("logs", "-n", "1", b, a).stdout  # without -f: each job's lines, in the order asked
    assert both == f"{b} b     | b ends first\n{a} alpha | alpha ends\n"
    refused = jw("logs", "--run", "1", a, b)
    assert refused.returncode == 2 and "--run goes with one JOB" in refused.stderr


def test_several_jobs_in_a_terminal_are_sanitised_and_coloured(jw: Jobwarden, tmp_path: Path) -> None:
    code = f"import sys\nprint('out:' + sys.argv[1] + ' {RED}')\nprint('bar 10%\\rbar 90%')\n"
    one = jw.start(sys.executable, "-c", code, HOSTILE)
    two = jw.start("echo", "plain")
    for job in (one, two):
        assert jw("wait", str(job["id"])).returncode == 0
    env = {k: v for k, v in jw.env.items() if k != "NO_COLOR"}
    shown = in_a_terminal(env, "logs", "-f", str(one["id"]), str(two["id"]))
    assert_clean(shown.replace("\x1b[36m", "").replace("\x1b[35m", ""), "logs -f of two jobs", colours=True)
    assert RED in shown and "plain" in shown
    assert "bar 90%" in shown and "bar 10%" not in shown  # a redrawn line as its last frame
    assert f"\x1b[36m{one['id']} " in shown and f"\x1b[35m{two['id']} echo" in shown  # coloured prefixes


def test_a_pipe_gets_the_jobs_lines_after_the_prefix_as_their_last_frame(jw: Jobwarden) -> None:
    one = jw.start("printf", "a\\rb\\n\\033[31mx\\n")
    two = jw.start("echo", "two")
    for job in (one, two):
        assert jw("wait", str(job["id"])).returncode == 0

    def piped(*options: str) -> bytes:
        return subprocess.run(
            [sys.executable, "-m", "jobwarden", "logs", *options, str(one["id"]), str(two["id"])],
            env=jw.env,
            capture_output=True,
            timeout=CLI_TIMEOUT_S,
        ).stdout

    assert piped() == b"1 printf | b\n1 printf | \x1b[31mx\n2 echo   | two\n"
    assert piped("--raw") == b"1 printf | a\rb\n1 printf | \x1b[31mx\n2 echo   | two\n"


def test_logs_without_a_job_in_an_empty_home_says_there_is_none(jw: Jobwarden) -> None:
    result = jw("logs", "-f")  # with no JOB: the newest job (test_cli_habits), and here there is none
    assert result.returncode == 1 and "no job yet in this jobwarden home" in result.stderr


# --- one time zone -------------------------------------------------------------------------------------


def test_times_are_local_with_their_offset_and_utc_on_request(jw: Jobwarden) -> None:
    jw.env["TZ"] = "Asia/Kolkata"  # +05:30: an offset no test machine has by chance
    jw("run", "-w", "--name", "tz", "--", "true", check=True)
    started_json = jw.status(1)["started_at"]  # JSON stays UTC ISO 8601
    assert started_json.endswith("Z")
    utc_hms = started_json[11:19]
    local = next(line for line in jw("status", "1").stdout.splitlines() if "started" in line)
    assert local.endswith(" +05:30"), local
    hours, minutes = int(utc_hms[:2]), int(utc_hms[3:5])
    shifted = (hours * 60 + minutes + 330) % (24 * 60)
    assert f" {shifted // 60:02d}:{shifted % 60:02d}:{utc_hms[6:8]} +05:30" in local  # 24-hour, shifted
    utc = next(line for line in jw("--utc", "status", "1").stdout.splitlines() if "started" in line)
    assert utc.endswith(f"{started_json[:10]} {utc_hms} UTC"), utc
    after = next(line for line in jw("status", "1", "--utc").stdout.splitlines() if "started" in line)
    assert after == utc  # after the subcommand too
    jw.env["JOBWARDEN_UTC"] = "1"
    by_env = next(line for line in jw("status", "1").stdout.splitlines() if "started" in line)
    assert by_env == utc
    jw.env.pop("JOBWARDEN_UTC")
    config = Path(jw.env["XDG_CONFIG_HOME"]) / "jobwarden" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[display]\nutc = true\n")
    config.chmod(0o600)
    by_file = next(line for line in jw("status", "1").stdout.splitlines() if "started" in line)
    assert by_file == utc
    assert "[display] utc = true" in jw("doctor").stdout
    jw.env["JOBWARDEN_UTC"] = "0"  # the environment overrides the file
    assert next(line for line in jw("status", "1").stdout.splitlines() if "started" in line) == local
    jw.env.pop("JOBWARDEN_UTC")
    config.write_text("[display]\nutc = 'yes'\n")
    bad = jw("status", "1")
    assert bad.returncode == 2 and "display.utc" in bad.stderr and "not true or false" in bad.stderr


# --- status: what the job runs under -------------------------------------------------------------------


def test_status_says_what_the_job_runs_under_without_secrets(jw: Jobwarden) -> None:
    secret_url = "https://hooks.example.invalid:8443/services/T0/B0/TOKEN-IN-PATH?key=QUERYKEY"
    jw(
        "run", "-w", "--name", "under", "--timeout", "1h", "--hang-timeout", "5m", "--on-hang", "stop",
        "--mem-limit", "2G", "--restart", "on-failure", "--max-restarts", "1", "--restart-delay", "0.1s",
        "--env", "API_TOKEN=VALUE-NOT-SHOWN", "--env", "SEED=1", "--notify", secret_url,
        "--on-event", "logger --tag TOKEN-IN-ARGS", "--", "sh", "-c", "exit 3",
    )  # fmt: skip
    shown = jw("status", "1").stdout
    for secret in ("VALUE-NOT-SHOWN", "TOKEN-IN-PATH", "QUERYKEY", "TOKEN-IN-ARGS"):
        assert secret not in shown
    lines = {line[:15].strip(): line[15:] for line in shown.splitlines() if line.startswith("  ")}
    assert lines["timeout"] == "1h00m, then stopped (SIGTERM, SIGKILL 10s later)"
    assert lines["hang timeout"] == "5m00s; on a hang: stop"
    assert lines["memory limit"] == "2.0G"
    assert lines["restart"] == "on-failure, at most 1 time"
    assert lines["notify"].startswith("hooks.example.invalid:8443 ")
    assert lines["on event"] == "logger"
    assert lines["env"] == "API_TOKEN, SEED (--env; values not shown)"
    assert " peak memory " in lines["elapsed"] and lines["elapsed"].endswith("restarts 1 of 1")
    record = jw.status(1)
    assert "VALUE-NOT-SHOWN" not in str(record) and "TOKEN-IN-PATH" not in str(record)
    under = record["runs_under"]
    assert under["timeout_s"] == 3600 and under["hang_timeout_s"] == 300 and under["on_hang"] == "stop"
    assert under["mem_limit_bytes"] == 2 << 30 and under["restart"] == "on-failure"
    assert under["max_restarts"] == 1 and under["restarts"] == 1 and record["restarts"] == 1
    assert under["env_keys"] == ["API_TOKEN", "SEED"] and under["notify_host"] == "hooks.example.invalid:8443"
    assert record["elapsed_s"] is not None and record["elapsed_s"] >= 0


def test_status_of_a_plain_job_shows_the_default_hang_timeout_and_nothing_unset(jw: Jobwarden) -> None:
    jw("run", "-w", "--", "true", check=True)
    shown = jw("status", "1").stdout
    assert "  hang timeout 10m00s (default); on a hang: dump" in shown
    for unset in (
        "  timeout ",
        "memory limit",
        "  restart ",
        "  notify ",
        "  env ",
        "  queue ",
        "  mp start",
        "  py hooks",
        "  log max",
        "  keep running",
    ):
        assert unset not in shown
    assert "restarts 0" in shown
    assert jw.status(1)["runs_under"]["env_keys"] == []
    options = ("--mp-start", "spawn", "--no-py-hooks", "--log-max", "1G", "--keep-running", "tensorboard")
    jw("run", "-w", *options, "--", "true", check=True)
    lines = {line[:15].strip(): line[15:] for line in jw("status", "2").stdout.splitlines()}
    assert lines["mp start"] == "spawn (--mp-start)" and lines["py hooks"].startswith("off (--no-py-hooks)")
    assert lines["log max"] == "1.0G" and lines["keep running"] == "tensorboard"


# --- ps: age, GPUs, filters, whole lines, a hung job -----------------------------------------------------


def ps_rows(jw: Jobwarden, *args: str) -> list[dict[str, str]]:
    """`ps`'s table as dicts by heading (the columns split where the heading's words start)."""
    lines = jw("ps", *args, check=True).stdout.splitlines()
    heads = lines[0].split()
    starts = [lines[0].index(f"{h} " if h != heads[-1] else h) for h in heads]
    return [
        {
            h: line[s : (starts[i + 1] if i + 1 < len(starts) else None)].strip()
            for i, (h, s) in enumerate(zip(heads, starts, strict=True))
        }
        for line in lines[1:]
    ]


def test_ps_filters_by_state_name_and_since_and_says_ages(jw: Jobwarden, tmp_path: Path) -> None:
    jw("run", "-w", "--name", "lr-1", "--", "true", check=True)
    jw("run", "-w", "--name", "lr-2", "--", "false")
    jw("run", "-w", "--name", "other", "--", "false")
    live, go = start_printer(jw, tmp_path, 1, "lr-live")
    try:
        assert [r["NAME"] for r in ps_rows(jw, "--state", "failed")] == ["lr-2", "other"]  # no --all needed
        assert [r["NAME"] for r in ps_rows(jw, "--state", "FAILED,running", "--name", "lr-*")] == [
            "lr-2",
            "lr-live",
        ]
        assert [r["NAME"] for r in ps_rows(jw, "--all", "--name", "lr-?")] == ["lr-1", "lr-2"]
        assert [r["NAME"] for r in ps_rows(jw, "--state", "failed", "--last", "1")] == ["other"]
        assert len(ps_rows(jw, "--since", "1h")) == 4  # the ended ones ended within the hour
        with sqlite3.connect(jw.home / "jobwarden.db") as db:  # as if job 1 had ended two hours ago
            db.execute("UPDATE runs SET ended_at = ended_at - 7200 WHERE job_id = 1")
        db.close()
        assert [r["NAME"] for r in ps_rows(jw, "--since", "1h")] == ["lr-2", "other", "lr-live"]
        assert [r["NAME"] for r in ps_rows(jw, "--all", "--since", "1h")] == ["lr-2", "other", "lr-live"]
        rows = {r["NAME"]: r for r in ps_rows(jw, "--all")}
        assert rows["lr-1"]["AGE"].startswith("2h") and rows["lr-1"]["AGE"].endswith(" ago")
        assert rows["lr-live"]["AGE"][-1] == "s" and "ago" not in rows["lr-live"]["AGE"]
        assert "GPU" not in rows["lr-1"]  # no job was given a GPU: no column
        as_json = {j["name"]: j for j in jw.json("ps", "--state", "failed")}
        assert set(as_json) == {"lr-2", "other"} and as_json["other"]["hung"] is False
        for bad, said in (
            ("bogus", "unknown state 'bogus'"),
            ("", "no state given"),
            ("run,", "unknown state"),
        ):
            refused = jw("ps", "--state", bad)
            assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr
        assert "--since: bad duration" in jw("ps", "--since", "yesterday").stderr
    finally:
        write_fifo(go, "end\n")
        jw("wait", live)


def test_ps_shows_whole_commands_into_a_pipe_and_with_wide_and_the_gpus_given(jw: Jobwarden) -> None:
    long_arg = "x" * 300
    jw("run", "-w", "--", "echo", long_arg, check=True)
    with sqlite3.connect(jw.home / "jobwarden.db") as db:  # GPUs as a machine with them would have given
        db.execute("UPDATE runs SET gpu_ids = '[0, 3]' WHERE job_id = 1")
    db.close()
    jw.env.pop("COLUMNS", None)
    piped = jw("ps", "--all").stdout  # not a terminal: never cut
    assert long_arg in piped and "…" not in piped
    jw.env["COLUMNS"] = "80"  # unless COLUMNS says a width, as procps' ps does
    assert long_arg not in jw("ps", "--all").stdout
    assert ps_rows(jw, "--all")[0]["GPU"] == "0,3"
    assert jw.json("ps", "--all")[0]["gpu_ids"] == [0, 3]
    env = {k: v for k, v in jw.env.items() if k != "NO_COLOR"}
    cut = in_a_terminal(env, "ps", "--all")
    assert long_arg not in cut and "…" in cut  # a terminal: cut to its width
    wide = in_a_terminal(env, "ps", "--all", "-w")  # -w: never cut, even in a terminal
    assert long_arg in wide.replace("\r\n", "").replace("\n", "") and "VERDICT" in wide


def test_a_hung_job_looks_hung_in_ps(jw: Jobwarden, tmp_path: Path) -> None:
    ready = make_fifo(tmp_path / "ready")
    code = "import sys, time\nopen(sys.argv[1], 'w').write('r\\n')\ntime.sleep(600)\n"
    job = jw.start(
        sys.executable, "-c", code, str(ready), options=("--name", "stuck", "--hang-timeout", "2s")
    )
    read_fifo(ready)
    try:
        listed = eventually("hung", lambda: jw.json("ps", "--state", "hung"), 60, every_s=0.2)
        assert [j["id"] for j in listed] == [job["id"]] and listed[0]["state"] == "running"
        assert listed[0]["hung"] is True
        row = ps_rows(jw)[0]
        assert row["STATE"] == "hung [no-progress]"
        assert [j["id"] for j in jw.json("ps", "--state", "running")] == [job["id"]]  # still running
        env = {k: v for k, v in jw.env.items() if k != "NO_COLOR"}
        assert "\x1b[35;1mhung [no-progress]" in in_a_terminal(env, "ps")  # its own colour, not green
        # one state, one word, everywhere: status and explain say `hung` as ps does, never `running`
        assert jw("status", str(job["id"])).stdout.startswith(f"job {job['id']} (stuck) — hung\n")
        assert jw("explain", str(job["id"])).stdout.startswith(f"job {job['id']} (stuck), run 1 — hung\n")
        assert jw.status(job["id"])["hung"] is True
    finally:
        jw("stop", str(job["id"]))


# --- words: nothing said twice ------------------------------------------------------------------------


COMMON_ENDS = {
    "exit": ("sh", "-c", "echo out; exit 3"),
    "signal": ("sh", "-c", "kill -KILL $$"),
    "exception": (sys.executable, "-c", "raise ValueError('boom')"),
    "success": ("true",),
}


@pytest.mark.parametrize("case", sorted(COMMON_ENDS))
def test_no_line_is_said_twice_in_run_f_status_or_explain(jw: Jobwarden, case: str) -> None:
    ended = jw("run", "-f", "--name", case, "--", *COMMON_ENDS[case])
    outputs = {
        "run -f (its own lines)": ended.stderr,
        "status": jw("status", "1", check=True).stdout,
        "explain": jw("explain", "1", check=True).stdout,
    }
    for where, text in outputs.items():
        lines = [line.strip(" -") for line in text.splitlines() if line.strip()]
        repeated = {line for line in lines if lines.count(line) > 1}
        assert not repeated, f"{case}: {where} says twice: {repeated}\n{text}"


def test_an_evidence_line_that_repeats_the_title_is_not_shown_but_kept_in_json(jw: Jobwarden) -> None:
    jw("run", "-w", "--", "sh", "-c", "echo why; exit 3")
    shown = jw("explain", "1").stdout
    assert "root cause: Exited with code 3" in shown
    assert "- exit code 3" not in shown  # the title said it
    assert "- output: why" in shown
    evidence = jw.json("explain", "1")["findings"][0]["evidence"]
    assert "exit code 3" in evidence  # the record keeps it whole


def test_status_peak_memory_is_the_oom_kills_not_the_last_sample(jw: Jobwarden) -> None:
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        unavailable("no memory cgroup on this machine")
    hog = "x = bytearray(400 << 20)\nx[::4096] = b'x' * len(x[::4096])\n"  # every page touched at once
    jw("run", "-w", "--mem-limit", "64M", "--", sys.executable, "-c", hog)
    record = jw.status(1)
    if not str(record["containment"]).startswith("cgroup-"):
        unavailable("--mem-limit got no memory cgroup here: jobwarden's watchdog kept the limit")
    assert "oom-kill" in [f["rule"] for f in record["findings"]], record["findings"]
    assert record["peak_rss_bytes"] >= 48 << 20  # the cgroup's peak at the kill, not a sample's 10M
    line = next(line for line in jw("status", "1").stdout.splitlines() if line.startswith("  elapsed"))
    shown = line.split(" peak memory ")[1].split()[0]
    # the cgroup's 64M at the kill, or a sample of the processes' RSS just before it, which also counts
    # the interpreter's shared pages charged to another cgroup (70.0M once in a CI-like run)
    assert shown.endswith("M") and 48 <= float(shown[:-1]) <= 128, line

"""Notifications against a real HTTP server on loopback and real shell hooks: delivered, refused, slow,
failing, hanging. The caller never blocks, and no failure escapes as an exception."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from jobwarden.shim.record.notify import Notifier, event_payload
from tests.conftest import Jobwarden, make_fifo, read_fifo, wait_pid_gone, write_fifo
from tests.integration.webhook import Server
from tests.support import eventually

pytestmark = pytest.mark.integration
EVENT = event_payload(
    "failed", 7, "train.py", 1, "failed", exit_code=3, finding="CUDA out of memory", host="h"
)


def test_an_event_is_posted_as_json_with_a_slack_text(server: Server) -> None:
    log: list[str] = []
    notifier = Notifier(server.url, None, log.append)
    notifier.deliver(EVENT)
    notifier.close(30)
    ((path, content_type, body),) = server.received
    assert (path, content_type) == ("/services/T0/B0/secret", "application/json")
    assert body == EVENT
    assert body["text"] == "jobwarden on h: job 7 (train.py) run 1 failed (exit code 3): CUDA out of memory"
    assert log == [f"notify: failed delivered to http://127.0.0.1:{server.server_address[1]}/… (HTTP 200)"]
    assert "secret" not in " ".join(log)


def test_a_refused_connection_is_logged_not_raised() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log: list[str] = []
    notifier = Notifier(f"http://127.0.0.1:{port}/hook", None, log.append)
    notifier.deliver(EVENT)
    notifier.close(30)
    assert len(log) == 1 and "failed: connection refused" in log[0]


def test_a_non_2xx_answer_is_logged(server: Server) -> None:
    server.status = 500
    log: list[str] = []
    notifier = Notifier(server.url, None, log.append)
    notifier.deliver(EVENT)
    notifier.close(30)
    assert len(log) == 1 and log[0].endswith("failed: HTTP 500")


def test_a_slow_server_never_blocks_the_caller_and_times_out(server: Server) -> None:
    server.gate.clear()  # the server reads the request, then does not answer
    log: list[str] = []
    notifier = Notifier(server.url, None, log.append, timeout_s=1.0)
    started = time.monotonic()
    notifier.deliver(EVENT)
    notifier.deliver({**EVENT, "event": "hung"})
    queued = time.monotonic() - started
    assert server.arrived.wait(30)
    notifier.close(30)
    waited = time.monotonic() - started
    assert queued < 0.5  # deliver only queues
    assert waited < 20  # each delivery is bounded by its timeout (two of 1s here), whatever the server does
    assert [line.split(" to ")[0] for line in log] == ["notify: failed", "notify: hung"]
    assert all("timed out" in line for line in log)


def test_close_gives_up_after_its_own_bound(server: Server) -> None:
    server.gate.clear()
    log: list[str] = []
    notifier = Notifier(server.url, None, log.append, timeout_s=30)
    notifier.deliver(EVENT)
    assert server.arrived.wait(30)
    started = time.monotonic()
    notifier.close(0.5)
    assert time.monotonic() - started < 5
    assert log == ["notify: gave up waiting after 0.5s; 1 event not delivered"]


def test_the_on_event_command_gets_the_json_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "event.json"
    log: list[str] = []
    notifier = Notifier(None, f'cat > {out}; echo "$JOBWARDEN_EVENT" >> {out}.kind', log.append)
    notifier.deliver(EVENT)
    notifier.close(30)
    assert json.loads(out.read_text()) == EVENT
    assert Path(f"{out}.kind").read_text() == "failed\n"
    assert log == ["notify: --on-event command ran for failed"]


def test_a_failing_on_event_command_is_logged_with_its_exit_code() -> None:
    log: list[str] = []
    notifier = Notifier(None, "cat >/dev/null; exit 3", log.append)
    notifier.deliver(EVENT)
    notifier.close(30)
    assert log == ["notify: --on-event command for failed failed: exit code 3"]


def test_a_hanging_on_event_command_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child"
    log: list[str] = []
    # the hook starts a background child and waits: the timeout must end both, not only the shell
    notifier = Notifier(None, f"sleep 3600 & echo $! > {pid_file}; wait", log.append, timeout_s=1.0)
    notifier.deliver(EVENT)
    notifier.close(30)
    assert log == ["notify: --on-event command for failed failed: timed out (its session was killed)"]
    wait_pid_gone(int(pid_file.read_text()), timeout_s=10)


def test_the_url_and_the_command_both_get_each_event(server: Server, tmp_path: Path) -> None:
    out = tmp_path / "event.json"
    log: list[str] = []
    notifier = Notifier(server.url, f"cat > {out}", log.append)
    for kind in ("restarted", "succeeded"):
        notifier.deliver({**EVENT, "event": kind})
    notifier.close(30)
    assert [body["event"] for _, _, body in server.received] == ["restarted", "succeeded"]
    assert json.loads(out.read_text())["event"] == "succeeded"
    assert len(log) == 4


def test_no_thread_is_left_once_the_queue_is_empty(server: Server) -> None:
    notifier = Notifier(server.url, None, lambda _: None)
    notifier.deliver(EVENT)
    notifier.close(30)
    assert not [t for t in threading.enumerate() if t.name == "jobwarden-notify"]


# --- the run options -------------------------------------------------------------------------------


def test_run_stores_notify_and_on_event_in_the_job_options(jw: Jobwarden) -> None:
    jw(
        "run",
        "--notify",
        "https://example.com/hook",
        "--on-event",
        "logger -t jw",
        "--wait",
        "--",
        "true",
        check=True,
    )
    conn = sqlite3.connect(f"file:{jw.home / 'jobwarden.db'}?mode=ro", uri=True)
    try:
        (options,) = conn.execute("SELECT options FROM jobs").fetchone()
    finally:
        conn.close()
    stored = json.loads(options)
    assert (stored["notify"], stored["on_event"]) == ("https://example.com/hook", "logger -t jw")


def test_run_refuses_a_notify_url_that_is_not_http(jw: Jobwarden) -> None:
    result = jw("run", "--notify", "ftp://example.com/x", "--", "true")
    assert result.returncode == 2
    assert "not an http(s) URL" in result.stderr and "https://" in result.stderr
    assert not (jw.home / "jobwarden.db").exists() or jw.json("ps", "--all") == []


def test_hook_processes_run_in_their_own_session(tmp_path: Path) -> None:
    out = tmp_path / "ids"
    notifier = Notifier(None, f"ps -o sid= -p $$ > {out}", lambda _: None)
    notifier.deliver(EVENT)
    notifier.close(30)
    assert int(out.read_text()) != os.getsid(0)


def test_a_running_hook_is_named_so_the_shim_can_tell_it_from_the_job(tmp_path: Path) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    notifier = Notifier(None, f"cat >/dev/null; read x < {fifo}", lambda _: None)
    notifier.deliver(EVENT)
    # the hook's start is reported from the delivery thread
    eventually("the hook's pid recorded", notifier.helper_pids, 30, every_s=0.01)
    (pid,) = notifier.helper_pids()
    assert Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1] == str(os.getpid())
    write_fifo(fifo, "done\n")
    notifier.close(30)
    assert notifier.helper_pids() == set()


# --- in the shim --------------------------------------------------------------------------------------

TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")


def test_the_shim_runs_hooks_outside_the_jobs_tree(jw: Jobwarden, tmp_path: Path) -> None:
    """A hook is a child of the shim, like the job: it must never be taken for one of the job's
    processes (recorded, listed as an orphan, swept with the job at its end)."""
    hook_ready, release = make_fifo(tmp_path / "hook"), make_fifo(tmp_path / "release")
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    hook = (
        f"cat > {tmp_path}/$JOBWARDEN_EVENT.json; [ $JOBWARDEN_EVENT = restarted ] || exit 0; "
        f"trap 'echo TERM > {tmp_path}/termed; exit 1' TERM; echo $$ > {hook_ready}; read x < {release}"
    )
    first_fails = f"test -e {tmp_path}/mark || {{ touch {tmp_path}/mark; exit 1; }}"
    restart = ("--restart", "on-failure", "--max-restarts", "1", "--restart-delay", "0.1s")
    job = jw.start(
        "sh", "-c", f"{first_fails}; exec {sys.executable} {TICKER} {ready} {go} 1",
        options=(*restart, "--on-event", hook),
    )  # fmt: skip
    hook_pid = int(read_fifo(hook_ready))  # run 1 failed: the "restarted" hook runs, and blocks
    read_fifo(ready)  # run 2 is up
    write_fifo(go, "0 0\n")  # run 2 succeeds: its supervisor sweeps the whole tree, then records the end
    # the sweep is inside the shim: no handshake
    eventually("run 2 ended", lambda: jw.status(job["id"])["state"] == "succeeded", 60, every_s=0.05)
    status = jw.status(job["id"])
    assert status["run"] == 2
    assert all(o["pid"] != hook_pid for o in status["orphans_left"])
    assert not (tmp_path / "termed").exists()  # not swept with the job
    conn = sqlite3.connect(f"file:{jw.home / 'jobwarden.db'}?mode=ro", uri=True)
    try:
        recorded = {pid for (pid,) in conn.execute("SELECT pid FROM processes")}
    finally:
        conn.close()
    assert hook_pid not in recorded
    write_fifo(release, "go\n")
    assert jw("wait", str(job["id"])).returncode == 0
    wait_pid_gone(hook_pid)
    restarted = json.loads((tmp_path / "restarted.json").read_text())
    assert (restarted["run"], restarted["after_run"]) == (
        2,
        1,
    )  # the run that starts, after the one that ended
    assert json.loads((tmp_path / "succeeded.json").read_text())["run"] == 2


def test_a_hook_still_running_when_the_notifier_gives_up_is_killed(tmp_path: Path) -> None:
    ready, child = make_fifo(tmp_path / "ready"), tmp_path / "child"
    log: list[str] = []
    notifier = Notifier(
        None, f"sleep 3600 & echo $! > {child}; echo up > {ready}; wait", log.append, timeout_s=600
    )
    notifier.deliver(EVENT)
    read_fifo(ready)
    # the hook may say "up" before the notifier's thread records its pid
    eventually("the hook's pid recorded", notifier.helper_pids, 60, every_s=0.01)
    (hook,) = notifier.helper_pids()
    started = time.monotonic()
    notifier.close(0.2)  # the shim exits: nothing of its hooks may outlive it
    assert time.monotonic() - started < 10
    wait_pid_gone(hook, timeout_s=10)
    wait_pid_gone(int(child.read_text()), timeout_s=10)
    assert log[0] == "notify: gave up waiting after 0.2s; 1 event not delivered"
    assert log[1] == "notify: --on-event command for failed failed: cancelled (its session was killed)"
    notifier.deliver(EVENT)  # closed: refused, not queued
    assert log[2] == "notify: closed; 'failed' not delivered"

"""`jobwarden run` as a real container's entrypoint (issue 22): the container lives as long as the job and
exits with its status, the verdict lands in the termination log and the last lines of stderr, a retryable end
exits with --requeue-exit's code, and as PID 1 it reaps the orphans an `exec` probe leaves."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_fifo, read_fifo, write_fifo
from tests.support import eventually

from .conftest import Box
from .helpers import add_job, ended, rules

pytestmark = [pytest.mark.integration, pytest.mark.container]


@pytest.mark.parametrize(
    ("script", "status", "state"),
    [
        ("echo out; exit 0", 0, "succeeded"),
        ("echo out; exit 3", 3, "failed"),
        ("echo out; kill -9 $$", 137, "failed"),
    ],
)
def test_the_container_exits_with_the_jobs_status(box: Box, script: str, status: int, state: str) -> None:
    container = box.entrypoint("--", "sh", "-c", script)
    done = container.run()
    assert done.returncode == status, done.stderr
    assert container.exit_code() == status
    assert done.stdout == "out\n"  # the job's output, copied by the attached CLI; no job id printed
    run, found, _ = ended(box.home)
    assert str(run.state) == state  # recorded, never `lost`
    # the verdict, as the last lines of stderr (what `docker logs` shows last)
    last = done.stderr.strip().splitlines()
    assert last[0].startswith(f"jobwarden: job 1 (sh) {state}") and last[0].endswith(f"exit {status}"), last
    if status:
        assert f"[{found[0].rule}]" in last[1], last


def test_the_termination_log_holds_the_verdict_safely(box: Box) -> None:
    """What `kubectl describe pod` shows: the root cause, its evidence and the remedy, at most 4 KiB,
    with nothing the job wrote able to drive the terminal that shows it."""
    script = box.tmp / "crash.py"
    script.write_text(
        "def load(path):\n"
        "    raise FileNotFoundError('no such file: ' + path + '\\x1b]0;pwned\\x07\\x1b[2J' + 'x' * 20000)\n"
        "load('/data/shard-7')\n"
    )
    log = box.tmp / "termination-log"
    container = box.entrypoint("--", "python3", "/t/crash.py", termination_log=log)
    done = container.run()
    assert done.returncode == 1, done.stderr
    text = log.read_text()
    assert 0 < len(text.encode()) <= 4096
    lines = text.splitlines()
    assert lines[0].startswith("jobwarden: job 1 (crash.py) failed: exit code 1")
    assert lines[1].startswith("root cause: ") and lines[1].endswith("[python-exception]"), lines
    assert "FileNotFoundError" in text and "/data/shard-7" in text
    assert any(line.startswith("what to do: ") for line in lines), lines
    assert "\x1b" not in text and "\x07" not in text
    # the same verdict ends stderr
    assert done.stderr.splitlines()[-len(lines) :][0] == lines[0]


def test_requeue_exit_only_for_a_retryable_end(box: Box) -> None:
    """--requeue-exit 200, as the README's ENTRYPOINT: a kill from outside (preemption, a node's agent) asks
    for a retry (a podFailurePolicy's onExitCodes), an exception never does."""
    killed = box.entrypoint("--requeue-exit", "200", "--", "sh", "-c", "kill -9 $$")
    assert killed.run().returncode == 200
    assert killed.exit_code() == 200
    raised = box.entrypoint("--requeue-exit", "200", "--", "python3", "-c", "raise ValueError('bad config')")
    done = raised.run()
    assert done.returncode == 1, done.stderr
    assert "python-exception" in done.stderr


def test_as_pid_1_it_reaps_the_orphans_of_exec_probes(box: Box) -> None:
    """`podman exec c sh -c 'cmd &'` (an exec probe, `kubectl exec`) orphans `cmd` into the container,
    where PID 1 inherits it: jobwarden reaps it when it ends, where a bare PID 1 keeps a zombie."""
    make_fifo(box.tmp / "ready")
    make_fifo(box.tmp / "gate")
    container = box.entrypoint("--", "python3", add_job(box.tmp, "waiter.py"), "exit")
    container.start()
    read_fifo(box.tmp / "ready")
    assert container.exec("cat", "/proc/1/cmdline").stdout.split("\0")[:3] == [
        "/opt/jw/bin/python3",
        "/usr/local/bin/jobwarden",
        "run",
    ]
    probe = container.exec("sh", "-c", "cat /t/gate < /dev/null > /dev/null 2>&1 & echo $!")
    orphan = int(probe.stdout)

    def parent_and_state() -> str:
        found = container.exec("sh", "-c", f"cat /proc/{orphan}/stat 2>/dev/null || echo gone").stdout
        return "gone" if found.startswith("gone") else " ".join(found.rpartition(")")[2].split()[:2])

    assert parent_and_state() == "S 1"  # the probe's shell has exited: PID 1 (jobwarden) adopted `cat`
    write_fifo(box.tmp / "gate")  # `cat` exits
    eventually(
        f"orphan {orphan} not reaped (a zombie under PID 1)",
        lambda: parent_and_state() == "gone",
        30,
        every_s=0.1,
    )
    container.stop(10)
    _, found, _ = ended(box.home)
    assert "cancelled-by-engine" in rules(found)


def test_the_health_probe_says_ok_hung_and_no_such_job(box: Box) -> None:
    """`jobwarden health` as an exec liveness probe: 0 while the job shows progress, 1 once the watchdog
    judged it hung, 0 again when it moves, 2 for a job that does not exist; 1 for a failed job, asked from a
    second container on the same home (a sidecar)."""
    for name in ("ready", "hush", "wake"):
        make_fifo(box.tmp / name)
    container = box.entrypoint("--hang-timeout", "2s", "--", "python3", add_job(box.tmp, "talker.py"))
    container.start()
    read_fifo(box.tmp / "ready")

    def health(*args: str) -> int:
        return container.exec("jobwarden", "health", *args).returncode

    assert health() == 0
    write_fifo(box.tmp / "hush")
    eventually("the probe never said hung", lambda: health() == 1, 60, every_s=0.1)
    hung = container.exec("jobwarden", "health", "--json")
    assert '"status": "hung"' in hung.stdout
    assert health("1") == 1 and health("99") == 2
    write_fifo(box.tmp / "wake")
    eventually("the probe still says hung after the job moved again", lambda: health() == 0, 30, every_s=0.1)
    container.stop(10)
    sidecar = box.create("jobwarden", "health", "--json")
    done = sidecar.run()
    assert done.returncode == 1, done.stdout  # stopped by the container's stop: not healthy
    assert '"state": "stopped"' in done.stdout


def test_a_job_signal_from_the_runtime_reaches_the_job(box: Box) -> None:
    """`docker kill -s USR1` (a checkpoint request) goes to the job, which runs on."""
    make_fifo(box.tmp / "ready")
    container = box.entrypoint("--", "python3", add_job(box.tmp, "waiter.py"), "exit")
    container.start()
    read_fifo(box.tmp / "ready")
    box.podman.check("kill", "--signal", "USR1", container.name)
    eventually(
        "SIGUSR1 did not reach the job", lambda: "got SIGUSR1" in container.logs().stdout, 30, every_s=0.1
    )
    assert container.inspect("{{.State.Running}}") == "true"
    container.stop(10)
    assert container.exit_code() == 0  # its SIGTERM handler ran: a checkpoint, then exit 0
    assert (box.tmp / "term").exists()


def test_doctor_in_a_container_says_what_it_sees(box: Box) -> None:
    done = box.create("jobwarden", "doctor", "--json", memory="200m").run()
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert "in a container (/run/.containerenv" in checks["container"]["message"]
    # the container's own cgroup counts OOM kills, read-only: said, and no longer "unavailable"
    containment = checks["containment"]
    assert containment["status"] == "ok", containment
    assert "OOM kills are counted" in containment["message"] and "200.0M" in containment["message"]
    assert "unavailable" not in containment["message"]
    assert "kernel log unreadable" in checks["container"]["message"]
    assert "no kernel process events" in checks["container"]["message"]

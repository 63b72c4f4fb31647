"""`jobwarden orphans` on real processes: the leftovers of a SIGKILLed supervisor and of an ended or
removed job are listed and ended; unrelated processes never are; another user's process is named with
the permission it needs, and left alone."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.osapi.cgroup import create_job_cgroup
from tests.conftest import (
    Jobwarden,
    alive,
    kill_shim,
    make_fifo,
    processes_under,
    read_fifo,
    start_time,
    wait_pid_gone,
    write_fifo,
)
from tests.support import unavailable

pytestmark = pytest.mark.integration
JOBS = Path(__file__).parent / "jobs"
DESCENDANTS = str(JOBS / "descendants.py")
TICKER = str(JOBS / "ticker.py")


def marked_env(jw: Jobwarden, job_id: int, run: int = 1, home: Path | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "JOBWARDEN_HOME": str(home or jw.home),
        "JOBWARDEN_JOB_ID": str(job_id),
        "JOBWARDEN_RUN": str(run),
    }


@contextlib.contextmanager
def sleeper(env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A `sleep` this test starts (and always reaps)."""
    proc = subprocess.Popen(["sleep", "3600"], env=env, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_processes_of_a_killed_supervisor_are_listed_and_killed(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "pids")
    job = jw.start(sys.executable, DESCENDANTS, str(fifo), "wait")
    descendants = {int(kv.split("=")[1]) for kv in read_fifo(fifo).split()}
    kill_shim(jw, job["id"])
    expected = {job["pid"], *descendants}  # setsid and double-forked ones included

    listed = jw.json("orphans")
    assert {s["pid"] for s in listed} == expected
    assert {(s["job"], s["run"], s["reason"]) for s in listed} == {
        (job["id"], 1, f"supervisor of job {job['id']} died")
    }
    assert all(s["user"] == pwd.getpwuid(os.geteuid()).pw_name and s["command"] for s in listed)
    table = jw("orphans", check=True).stdout
    assert str(job["pid"]) in table and "jobwarden orphans --kill" in table.splitlines()[-1]

    starts = {pid: start_time(pid) for pid in expected}
    result = jw("orphans", "--kill", "--grace", "5s")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("with SIGTERM") == len(expected)
    for pid in expected:
        wait_pid_gone(pid, timeout_s=10)
        assert not alive(pid, starts[pid] or -1)
    assert jw.json("orphans") == []


def test_a_marked_process_of_an_ended_then_removed_job_is_listed_and_killed(jw: Jobwarden) -> None:
    job_id = int(jw("run", "--wait", "--", "true", check=True).stdout.split()[0])
    with orphaned_sleeper(marked_env(jw, job_id)) as pid:  # a leftover: its parent is gone
        (stray,) = jw.json("orphans")
        assert stray["pid"] == pid and stray["job"] == job_id
        assert stray["reason"].startswith(f"job {job_id} run 1 ended ") and stray["reason"].endswith(
            "(succeeded)"
        )

        jw("rm", str(job_id), check=True)
        (stray,) = jw.json("orphans")
        assert (stray["pid"], stray["reason"]) == (pid, f"job {job_id} was removed")

        (outcome,) = jw.json("orphans", "--kill", "--grace", "5s")
        assert (outcome["pid"], outcome["ended"], outcome["ended_by"]) == (pid, True, "SIGTERM")
        wait_pid_gone(pid, timeout_s=10)


@contextlib.contextmanager
def orphaned_sleeper(env: dict[str, str], command: str = "sleep 3600") -> Iterator[int]:
    """A `sleep` (or `command`) whose parent exited at once (so init, or a subreaper, adopted it), as a
    job's leftover is; its pid. Killed (through a pidfd) and waited for on the way out, whatever happened."""
    started = subprocess.run(
        ["setsid", "sh", "-c", f"{command} </dev/null >/dev/null 2>&1 & echo $!"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    pid = int(started.stdout)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            fd = os.pidfd_open(pid)
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
        wait_pid_gone(pid)


def test_unrelated_processes_are_never_listed_nor_killed(jw: Jobwarden, tmp_path: Path) -> None:
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    live = jw.start(sys.executable, TICKER, str(ready), str(go), "1")
    read_fifo(ready)
    ended = int(jw("run", "--wait", "--", "true", check=True).stdout.split()[0])
    other_home = tmp_path / "another-store"
    with sleeper() as plain, sleeper(marked_env(jw, ended, home=other_home)) as foreign:
        assert jw.json("orphans") == []
        result = jw("orphans", "--kill", "--grace", "1s")
        assert result.returncode == 0 and "no strays" in result.stdout
        assert plain.poll() is None and foreign.poll() is None
        assert jw.status(live["id"])["state"] == "running"
    write_fifo(go, "0 0\n")
    assert jw("wait", str(live["id"])).returncode == 0


def test_a_survivor_that_ignores_sigterm_is_killed_after_the_grace(jw: Jobwarden, tmp_path: Path) -> None:
    job_id = int(jw("run", "--wait", "--", "true", check=True).stdout.split()[0])
    ready = make_fifo(tmp_path / "ready")
    script = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write('ready\\n'); time.sleep(3600)"
    )
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} {shlex.quote(str(ready))}"
    with orphaned_sleeper(marked_env(jw, job_id), command) as pid:
        read_fifo(ready)
        (outcome,) = jw.json("orphans", "--kill", "--grace", "1s")
        assert (outcome["pid"], outcome["ended_by"]) == (pid, "SIGKILL")
        wait_pid_gone(pid, timeout_s=10)


# --- another user's process --------------------------------------------------------------------------


def _run_as(user: str, *argv: str, env: dict[str, str], cwd: str = "/") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def two_users() -> Iterator[tuple[str, str]]:
    """Two throwaway users (root only): one owns the stray, the other runs `orphans --kill`."""
    if os.geteuid() != 0:
        unavailable("needs root: it creates two users, runs a process as one and jobwarden as the other")
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("setpriv")):
        unavailable("needs useradd, userdel and setpriv")
    tag = uuid.uuid4().hex[:6]
    names = (f"jwown{tag}", f"jwrun{tag}")
    created = []
    try:
        for name in names:
            subprocess.run(
                ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name], check=True
            )
            created.append(name)
        yield names
    finally:
        for name in created:
            subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.mark.needs_root
def test_another_users_stray_is_named_with_the_permission_it_needs(
    jw: Jobwarden, two_users: tuple[str, str]
) -> None:
    owner, runner = two_users
    if _run_as(runner, sys.executable, "-c", "import jobwarden", env=jw.env).returncode != 0:
        pytest.skip(f"{sys.executable} with jobwarden cannot be run by an unprivileged user here")
    shared = Path(tempfile.mkdtemp(prefix="jw-users-"))  # tmp_path's parents are private to root
    try:
        shared.chmod(0o755)
        home = shared / "home"
        jw.env["JOBWARDEN_HOME"] = str(home)
        jw.home = home
        ready = make_fifo(shared / "ready")
        ready.chmod(0o666)
        # a job whose process drops to `owner` (as `sudo -u` would), then its supervisor dies
        job = jw.start(
            "setpriv", f"--reuid={owner}", f"--regid={owner}", "--clear-groups", "--",
            "sh", "-c", f"echo ready > {ready}; exec sleep 3600",
        )  # fmt: skip
        read_fifo(ready)
        kill_shim(jw, job["id"])
        start = start_time(job["pid"])
        assert start is not None
        subprocess.run(["chown", "-R", f"{runner}:{runner}", str(home)], check=True)

        listed = _run_as(runner, sys.executable, "-m", "jobwarden", "orphans", "--json", env=jw.env)
        assert listed.returncode == 0, listed.stderr
        (stray,) = json.loads(listed.stdout)
        assert (stray["pid"], stray["user"], stray["job"]) == (job["pid"], owner, job["id"])

        killed = _run_as(
            runner, sys.executable, "-m", "jobwarden", "orphans", "--kill", "--grace", "1s", env=jw.env
        )
        assert killed.returncode == 1
        assert f"could not end {job['pid']}" in killed.stdout
        assert f"owned by another user ({owner}): rerun with sudo" in killed.stdout
        assert alive(job["pid"], start)  # never touched

        # root may, from a home of its own: it refuses to use another user's (symlinks planted there)
        subprocess.run(["chown", "-R", "root:root", str(home)], check=True)
        result = jw("orphans", "--kill", "--grace", "5s")
        assert result.returncode == 0, result.stdout
        wait_pid_gone(job["pid"])
    finally:
        left = processes_under(shared / "home")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            wait_pid_gone(pid)
        shutil.rmtree(shared, ignore_errors=True)


# --- GPU holders (NVML is the fake one: this machine has no GPU; /proc is the real one) -------------------


@contextlib.contextmanager
def orphaned_sleep() -> Iterator[int]:
    """A `sleep` whose parent exited at once (the runner of S5 that died): reparented to init or the
    nearest subreaper. Ended through a pidfd afterwards, whatever happens."""
    spawned = subprocess.run(
        ["sh", "-c", "sleep 3600 </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    pid = int(spawned.stdout)
    fd = os.pidfd_open(pid)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)
        wait_pid_gone(pid)


def test_a_gpu_holder_whose_parent_died_is_listed_and_killed(jw: Jobwarden, tmp_path: Path) -> None:
    from jobwarden.probes import fakenvml

    nvml = tmp_path / "nvml.json"
    fakenvml.write_state(nvml, {"devices": [fakenvml.device(0), fakenvml.device(1)]})
    jw.env[fakenvml.FAKE_NVML_ENV] = str(nvml)
    with orphaned_sleep() as orphan, orphaned_sleep() as desktop, sleeper() as owned:
        parent = Path(f"/proc/{orphan}/stat").read_text().rpartition(")")[2].split()[1]
        if parent != "1":
            pytest.skip(f"orphans here are adopted by a subreaper (pid {parent}), not init")
        fakenvml.hold(nvml, 0, orphan, 5 << 30)
        fakenvml.hold(nvml, 1, orphan, 1 << 29)
        fakenvml.hold(nvml, 0, desktop, 1 << 28, kind="graphics")  # a display server: never a stray
        fakenvml.hold(nvml, 1, owned.pid, 1 << 30)  # its parent (this test) is alive: someone owns it

        (stray,) = jw.json("orphans")
        assert (stray["pid"], stray["job"], stray["gpus"]) == (orphan, None, [0, 1])
        assert stray["gpu_memory_bytes"] == (5 << 30) + (1 << 29)
        assert "5.5G on GPU 0, 1" in stray["reason"] and "no live job" in stray["reason"]
        assert "init (pid 1)" in stray["reason"]

        (outcome,) = jw.json("orphans", "--kill", "--grace", "5s")
        assert (outcome["pid"], outcome["ended_by"]) == (orphan, "SIGTERM")
        wait_pid_gone(orphan, timeout_s=10)
        assert owned.poll() is None and alive(desktop, start_time(desktop) or -1)


def test_orphans_removes_the_empty_cgroups_of_dead_supervisors_and_nothing_else(jw: Jobwarden) -> None:
    gone = [subprocess.Popen(["true"]) for _ in range(2)]
    for proc in gone:
        proc.wait()  # pids no supervisor runs as: the shims named by these cgroups were killed
    stale = create_job_cgroup(f"jobwarden-{gone[0].pid}")
    busy = create_job_cgroup(f"jobwarden-{gone[1].pid}")
    if stale is None or busy is None:
        unavailable("no writable cgroup on this machine")
    with sleeper() as inside:  # a process of a lost job, still in its dead supervisor's cgroup
        busy.procs_file.write_text(str(inside.pid))
        try:
            assert jw("orphans").returncode == 0
            assert not stale.path.exists()
            assert busy.path.exists()  # never a populated one
        finally:
            inside.kill()
            inside.wait()
            with contextlib.suppress(OSError):
                busy.path.rmdir()
            with contextlib.suppress(OSError):
                stale.path.rmdir()

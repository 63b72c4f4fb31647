"""The seed incidents, reproduced with real processes, named by the live watchdog and by `explain`; and the
other side: quiet but healthy jobs raise no hang finding."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration
JOBS = Path(__file__).resolve().parent / "jobs"
PY = sys.executable


def rules_of(report: dict[str, Any]) -> list[str]:
    return [f["rule"] for f in report["findings"]]


def wait_for_finding(jw: Jobwarden, job: int, rule: str, timeout_s: float = 60) -> dict[str, Any]:
    """Poll `status --json` until the watchdog has recorded `rule` (a deadline, not a fixed sleep)."""

    def recorded() -> dict[str, Any] | None:
        return next((dict(f) for f in jw.status(job)["findings"] if f["rule"] == rule), None)

    return eventually(f"a {rule} finding of job {job}", recorded, timeout_s, every_s=0.2)


@pytest.mark.parametrize("mode", ["mp", "os"])
def test_fork_while_a_thread_holds_a_lock_is_named_fork_deadlock(
    jw: Jobwarden, tmp_path: Path, mode: str
) -> None:
    fifo = make_fifo(tmp_path / "child")
    opts = ("--hang-timeout", "2s", "--on-hang", "stop", "--grace", "1s")
    job = jw.start(PY, str(JOBS / "fork_deadlock.py"), str(fifo), mode, options=opts)
    child = int(read_fifo(fifo))
    jw("wait", str(job["id"]), "--timeout", "60s")
    report = jw.json("explain", str(job["id"]))
    assert report["findings"][0]["rule"] == "fork-deadlock", report["findings"]
    finding = report["findings"][0]
    assert child in finding["pids"]
    evidence = "\n".join(finding["evidence"])
    assert "lock-holder" in evidence  # the thread that held the lock at the fork
    assert "fork_deadlock.py" in evidence  # where the fork was made
    assert "forkserver" in finding["remedy"]
    assert jw.status(job["id"])["state"] == "failed"  # --on-hang stop: ended after the stacks were stored
    dump = jw.json("dump", str(job["id"]))
    assert any(s["pid"] == child and s["threads"] for s in dump)
    if mode == "mp":  # the job asks for fork by name: --mp-start cannot help, its own line is the fix
        line = next(
            n
            for n, text in enumerate((JOBS / "fork_deadlock.py").read_text().splitlines(), 1)
            if 'get_context("fork")' in text
        )
        assert f"get_context('fork') at {JOBS / 'fork_deadlock.py'}:{line}" in finding["remedy"]
        assert "--mp-start forkserver`" not in finding["remedy"]


def test_a_fork_deadlock_is_said_as_the_wait_for_graphs_chain(jw: Jobwarden, tmp_path: Path) -> None:
    # the parent waits for its child in waitpid (the kernel's edge), the child for a lock whose holder
    # thread stayed in the parent at the fork (the signature's edge)
    fifo = make_fifo(tmp_path / "child")
    opts = ("--hang-timeout", "2s", "--on-hang", "stop", "--grace", "1s")
    job = jw.start(PY, str(JOBS / "fork_deadlock.py"), str(fifo), "os", options=opts)
    child = int(read_fifo(fifo))
    jw("wait", str(job["id"]), "--timeout", "60s")
    finding = jw.json("explain", str(job["id"]))["findings"][0]
    assert finding["rule"] == "fork-deadlock" and finding["pids"] == [child], finding
    parent = jw.status(job["id"])["pid"]
    (chain,) = [e for e in finding["evidence"] if e.startswith("wait-for graph: ")]
    assert chain.startswith(f"wait-for graph: pid {parent} (")
    assert f"waits for its child pid {child}, which waits for a lock at child_work (" in chain
    assert chain.endswith(
        f"held by a thread that stayed in pid {parent} at the fork; that thread does not exist in pid "
        f"{child}: nobody will ever release the lock"
    )


def test_a_fork_deadlock_under_mp_start_is_never_told_to_use_mp_start(jw: Jobwarden, tmp_path: Path) -> None:
    # the demo's own deadlock, run again with the advice of its first run: get_context("fork") wins
    opts = ("--hang-timeout", "2s", "--on-hang", "stop", "--grace", "1s", "--mp-start", "forkserver")
    job = jw.start(PY, str(JOBS.parents[2] / "demo" / "deadlock.py"), options=opts)
    jw("wait", str(job["id"]), "--timeout", "60s")
    finding = jw.json("explain", str(job["id"]))["findings"][0]
    assert finding["rule"] == "fork-deadlock", finding
    assert "demo/deadlock.py:" in finding["remedy"] and "get_context('fork')" in finding["remedy"]
    assert "jobwarden run --mp-start" not in finding["remedy"]
    assert "JOB" not in finding["remedy"].replace("JOBWARDEN", "")


def wait_until_watched(jw: Jobwarden, job: int, pid: int, timeout_s: float = 60) -> None:
    """A process born and killed between two scans of the tree (1 s apart) is never seen, so its death
    cannot be named; in the seed incident the worker had run for hours. Wait until jobwarden holds it."""
    eventually(
        f"pid {pid} in the job's tree",
        lambda: pid in [p["pid"] for p in jw.status(job)["processes"]],
        timeout_s,
        every_s=0.1,
    )


def kill_a_pool_worker(jw: Jobwarden, tmp_path: Path) -> tuple[dict[str, Any], int, float]:
    """A pool whose worker jobwarden holds, then SIGKILLed: (the job, the worker, when it was killed)."""
    fifo = make_fifo(tmp_path / "worker")
    job = jw.start(PY, str(JOBS / "pool_lost_worker.py"), str(fifo), "kill", options=("--grace", "1s"))
    worker = int(read_fifo(fifo))
    wait_until_watched(jw, job["id"], worker)
    os.kill(worker, signal.SIGKILL)
    return job, worker, time.monotonic()


def test_a_pool_worker_killed_is_named_within_seconds(jw: Jobwarden, tmp_path: Path) -> None:
    job, worker, killed_at = kill_a_pool_worker(jw, tmp_path)
    finding = wait_for_finding(jw, job["id"], "pool-worker-lost")
    assert time.monotonic() - killed_at < 10  # the default hang window is 10 minutes: this was an event
    assert worker in finding["pids"]
    assert "SIGKILL" in "\n".join(finding["evidence"])
    assert "oom-kill" not in rules_of(jw.status(job["id"]))
    jw("stop", str(job["id"]), check=True)


def test_a_lost_pool_worker_is_said_as_the_wait_for_graphs_chain(jw: Jobwarden, tmp_path: Path) -> None:
    # pool-worker-lost is an edge of the wait-for graph: the parent's result wait, whose only feeder died
    job, worker, _ = kill_a_pool_worker(jw, tmp_path)
    finding = wait_for_finding(jw, job["id"], "pool-worker-lost")
    parent = jw.status(job["id"])["pid"]
    (chain,) = [e for e in finding["evidence"] if e.startswith("wait-for graph: ")]
    assert chain.startswith(f"wait-for graph: pid {parent} (")
    assert re.search(
        rf"waits in (Pool\.)?map \(multiprocessing/pool\.py:\d+\) for a result of pid {worker}; ", chain
    )
    assert chain.endswith(
        f"pid {worker} was killed by SIGKILL: the result never comes, everything waits for it"
    )
    assert finding["pids"][:2] == [worker, parent]  # the dead feeder first: everything waits for it
    jw("stop", str(job["id"]), check=True)


def test_a_pool_worker_oom_killed_under_a_memory_limit(jw: Jobwarden, tmp_path: Path) -> None:
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        unavailable("no memory cgroup on this machine")
    fifo = make_fifo(tmp_path / "pool")
    opts = ("--mem-limit", "256M", "--grace", "1s")
    go = make_fifo(tmp_path / "pool.go")
    job = jw.start(PY, str(JOBS / "pool_lost_worker.py"), str(fifo), "oom", options=opts)
    wait_until_watched(jw, job["id"], int(read_fifo(fifo)))
    write_fifo(go)
    finding = wait_for_finding(jw, job["id"], "pool-worker-lost")
    rules = rules_of(jw.status(job["id"]))
    assert rules.index("oom-kill") < rules.index("pool-worker-lost")  # root cause first
    assert "OOM" in finding["summary"] or "memory" in finding["summary"]
    jw("stop", str(job["id"]), check=True)


def test_a_stopped_process_is_named_at_once(jw: Jobwarden, tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "child")
    job = jw.start(PY, str(JOBS / "stopped_child.py"), str(fifo), options=("--grace", "1s"))
    child = int(read_fifo(fifo))
    os.kill(child, signal.SIGSTOP)
    finding = wait_for_finding(jw, job["id"], "process-stopped", timeout_s=30)
    assert finding["pids"] == [child]
    assert "SIGCONT" in finding["remedy"] or "kill -CONT" in finding["remedy"]
    assert jw.json("ps")[0]["finding"] == "process-stopped"  # ps shows the short form
    assert "[process-stopped]" in jw("ps").stdout
    os.kill(child, signal.SIGCONT)
    jw("stop", str(job["id"]), check=True)


def test_a_segfault_is_a_native_crash_with_the_faulthandler_frame(jw: Jobwarden, tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("import ctypes\n\ndef read_null():\n    ctypes.string_at(0)\n\nread_null()\n")
    result = jw("run", "--wait", "--", PY, str(script))
    assert result.returncode == 128 + signal.SIGSEGV
    finding = jw.json("explain", result.stdout.split()[0])["findings"][0]
    assert finding["rule"] == "native-crash"
    assert any("read_null" in line and "crash.py" in line for line in finding["evidence"])


def test_cuda_oom_text_in_the_output_is_named(jw: Jobwarden) -> None:
    code = (
        "import sys\n"
        "print('epoch 3 step 1200', flush=True)\n"
        "sys.exit('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.11 GiB of which 1.02 GiB is free.')\n"
    )
    result = jw("run", "--wait", "--", PY, "-c", code)
    assert result.returncode == 1
    report = jw.json("explain", result.stdout.split()[0])
    assert report["findings"][0]["rule"] == "cuda-oom"
    assert "2.00 GiB" in "\n".join(report["findings"][0]["evidence"])


@pytest.mark.parametrize("mode", ["cpu", "heartbeat", "disk", "child"])
def test_quiet_but_healthy_jobs_raise_no_hang(jw: Jobwarden, mode: str) -> None:
    opts = ("--hang-timeout", "2s", "--on-hang", "stop")
    result = jw("run", *opts, "--wait", "--", PY, str(JOBS / "quiet_but_healthy.py"), mode, "6")
    job_id = result.stdout.split()[0]
    status = jw.status(job_id)
    assert status["state"] == "succeeded", (status, jw.output(job_id))
    assert status["findings"] == []


def test_a_silent_hang_with_no_better_explanation_is_no_progress(jw: Jobwarden, tmp_path: Path) -> None:
    script = tmp_path / "waits.py"
    script.write_text(
        "import threading\nprint('waiting for the server', flush=True)\nthreading.Event().wait()\n"
    )
    opts = ("--hang-timeout", "2s", "--on-hang", "stop", "--grace", "1s")
    result = jw("run", *opts, "--wait", "--", PY, str(script))
    report = jw.json("explain", result.stdout.split()[0])
    first = report["findings"][0]
    assert first["rule"] == "no-progress", report["findings"]
    evidence = "\n".join(first["evidence"])
    assert "waits.py" in evidence  # the main thread's stack
    assert "waiting for the server" in evidence  # the last output


def test_a_process_stuck_in_d_state_is_uninterruptible_io(jw: Jobwarden, tmp_path: Path) -> None:
    # posix_spawn's child opens a FIFO nobody writes to before it execs; the parent waits for it inside
    # vfork, in the kernel, uninterruptibly (state D): a real D state without a dead NFS mount
    fifo = make_fifo(tmp_path / "never-written")
    code = (
        "import os\n"
        f"os.posix_spawn('/bin/true', ['true'], os.environ, "
        f"file_actions=[(os.POSIX_SPAWN_OPEN, 0, {str(fifo)!r}, os.O_RDONLY, 0)])\n"
    )
    opts = ("--hang-timeout", "2s", "--on-hang", "stop", "--grace", "1s")
    result = jw("run", *opts, "--wait", "--", PY, "-c", code)
    rules = rules_of(jw.json("explain", result.stdout.split()[0]))
    assert "uninterruptible-io" in rules, rules
    assert "no-progress" not in rules  # the D state explains the hang


def test_a_popen_child_that_failed_first_is_named_by_its_command_not_worker(jw: Jobwarden) -> None:
    # every process but the main one was titled "Worker pid N": here a `sort` run by subprocess.run
    code = "import subprocess; subprocess.run(['sort', '/nonexistent/input.txt'], check=True)"
    ran = jw("run", "--json", "--wait", "--", sys.executable, "-c", code)
    assert ran.returncode == 1, ran.stderr
    first = jw.json("explain", str(json.loads(ran.stdout)["id"]))["findings"][0]
    assert first["rule"] == "exit-code", first
    # by its command, or, when it died before the shim could read it (sort fails at once), as its
    # parent's child
    named = r"Process pid \d+ \((sort|child of pid \d+)\): exited with code 2"
    assert re.match(named, first["title"]), first["title"]

"""Who holds a GPU, with real processes: marked ones of a live and of an ended job, a job process that
cleared its environment, a double-forked stray now parented by init, and a jobwarden job started through
the CLI that takes a GPU itself. NVML is the fake one; /proc is the real one."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden.model import JobSpec, JobState, ProcessSnapshot
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import fakenvml
from jobwarden.probes.gpu import GpuProbe, open_gpu_probe
from jobwarden.shim.admission.gpus import describe_wait, gpu_holders, try_admit
from jobwarden.store import Store
from tests.conftest import Jobwarden, make_fifo, read_fifo, start_time, wait_pid_gone, write_fifo

pytestmark = pytest.mark.integration

GIB = 1 << 30
NOW = 1_700_000_000.0
NEVER_A_PID = 4_194_305  # above PID_MAX_LIMIT (2^22): no process can have it

# Prints its pid, then lives until its stdin closes.
SLEEPER = "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"
# Forks twice; the grandchild waits (pidfd) until its parent has exited, so it is now init's (or a
# subreaper's), prints its pid, then lives until the stdin it inherited closes.
DOUBLE_FORK = """
import os, select, sys
if os.fork() == 0:
    middle = os.getpid()
    if os.fork() == 0:
        try:
            select.select([os.pidfd_open(middle)], [], [], 60)
        except ProcessLookupError:
            pass  # already gone and reaped
        print(os.getpid(), flush=True)
        sys.stdin.read()
    os._exit(0)
os.wait()
"""


def read_line(stream: Any, timeout_s: float = 60) -> str:
    """One line from a child's stdout, with a deadline (a handshake, not a sleep)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    fd = stream.fileno()
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError(f"no line within {timeout_s}s (got {data!r})")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise EOFError(f"closed after {data!r}")
        data += chunk
    return data.decode().strip()


class Processes:
    """The processes a test starts; each is ended (its stdin closed) and reaped or awaited."""

    def __init__(self) -> None:
        self.popen: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []

    def start(self, code: str, env: dict[str, str]) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.popen.append(proc)
        pid = int(read_line(proc.stdout))
        self.pids.append(pid)
        return pid

    def close(self) -> None:
        for proc in self.popen:
            for stream in (proc.stdin, proc.stdout):
                if stream:
                    stream.close()  # EOF on stdin: the sleeper and the stray end by themselves
        for proc in self.popen:
            proc.wait(timeout=60)
        for pid in self.pids:
            wait_pid_gone(pid)


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def nvml(tmp_path: Path) -> Path:
    path = tmp_path / "nvml.json"
    fakenvml.write_state(path, {"devices": [fakenvml.device(i) for i in range(4)]})
    return path


@pytest.fixture
def probe(nvml: Path) -> Iterator[GpuProbe]:
    opened = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(nvml)})
    assert opened is not None
    yield opened
    opened.close()


def new_job(store: Store, name: str, state: JobState) -> int:
    job_id, _ = store.create_job(JobSpec(command=("python",), cwd="/", name=name), {}, NOW, state)
    return job_id


def test_real_processes_are_mapped_to_their_jobs_or_named_strays(
    tmp_path: Path, processes: Processes, nvml: Path, probe: GpuProbe
) -> None:
    home = tmp_path / "home"
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    with Store(home) as store:
        live = new_job(store, "train", JobState.RUNNING)
        ended = new_job(store, "old", JobState.FAILED)
        waiting = new_job(store, "next", JobState.QUEUED)
        marks = {**clean, "JOBWARDEN_HOME": str(home), "JOBWARDEN_RUN": "1"}
        member = processes.start(SLEEPER, {**marks, "JOBWARDEN_JOB_ID": str(live)})
        leftover = processes.start(SLEEPER, {**marks, "JOBWARDEN_JOB_ID": str(ended)})
        stray = processes.start(DOUBLE_FORK, clean)
        cleared = processes.start(SLEEPER, clean)  # a job's process started with `env -i`
        started = start_time(cleared)
        assert started is not None
        tree = [ProcessSnapshot(cleared, os.getpid(), started, "S", "python", 1 << 20, None)]
        store.record_tree(live, 1, NOW, tree, [])
        holdings = (
            (0, member, 5.1),
            (0, cleared, 1.0),
            (1, stray, 5.5),
            (2, leftover, 3.0),
            (3, NEVER_A_PID, 2.0),
        )
        for gpu, pid, size in holdings:
            fakenvml.hold(nvml, gpu, pid, int(size * GIB))

        holders = {h.pid: h for h in gpu_holders(store, probe, ProcFS())}
        assert set(holders) == {member, cleared, stray, leftover, NEVER_A_PID}

        h = holders[member]
        assert (h.job_id, h.run, h.job_name, h.live_job, h.stray) == (live, 1, "train", True, False)
        assert (h.gpu_index, h.used_bytes, h.ppid, h.uid) == (0, int(5.1 * GIB), os.getpid(), os.getuid())
        assert h.start_time == start_time(member) and h.cmdline.startswith(sys.executable)
        assert h.started_at is not None and abs(h.started_at - time.time()) < 120
        assert (holders[cleared].job_id, holders[cleared].live_job) == (live, True)

        h = holders[leftover]
        assert (h.job_id, h.run, h.job_name, h.live_job, h.stray) == (ended, 1, "old", False, True)

        h = holders[stray]
        assert h.job_id is None and h.stray and h.home is None
        ppid = ProcFS().stat(stray).ppid
        assert h.ppid == ppid and h.reparented_to_init == (ppid == 1)
        assert not holders[NEVER_A_PID].visible

        admission = try_admit(store, waiting, 1, probe, count=1, now=NOW)
        line = describe_wait(admission)
        assert line.startswith(
            f"waiting for 1 free GPU: GPU 0 held by job {live} (train) pid {member} 5.1 GiB, "
            f"job {live} (train) pid {cleared} 1.0 GiB; GPU 1 held by stray pid {stray} (user "
        )
        assert f"GPU 2 held by stray pid {leftover} (left by job {ended} (old) run 1, user " in line


def test_a_job_that_takes_a_gpu_is_found_as_its_holder(
    jw: Jobwarden, tmp_path: Path, nvml: Path, probe: GpuProbe
) -> None:
    jw.env[fakenvml.FAKE_NVML_ENV] = str(nvml)
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    take = f"{sys.executable} -m jobwarden.probes.fakenvml hold 0 {5 * GIB}"  # holder: its parent, sh
    script = f"{take} && echo $$ > {ready} && read x < {go}"
    job = jw.start("sh", "-c", script, options=("--gpus", "1", "--name", "takes-gpu"))
    try:
        pid = int(read_fifo(ready))
        with Store(jw.home) as store:
            (holder,) = gpu_holders(store, probe, ProcFS())
            assert (holder.pid, holder.gpu_index, holder.used_bytes) == (pid, 0, 5 * GIB)
            assert (holder.job_id, holder.run, holder.job_name) == (job["id"], 1, "takes-gpu")
            assert holder.live_job and not holder.stray
            other = new_job(store, "other", JobState.QUEUED)
            line = describe_wait(try_admit(store, other, 1, probe, ids=[0], now=NOW))
            assert line == f"waiting for GPU 0: GPU 0 held by job {job['id']} (takes-gpu) pid {pid} 5.0 GiB"
    finally:
        write_fifo(go)
    assert jw("wait", str(job["id"])).returncode == 0

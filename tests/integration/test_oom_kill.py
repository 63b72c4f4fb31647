"""The mechanisms for real: a cgroup limit the kernel enforces, the OOM killer's counters and log lines as
OomWatch reads them, /dev/kmsg read without blocking, and the memory of a real process tree."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from jobwarden.osapi.cgroup import JobCgroup, create_job_cgroup
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.kmsg import KernelLog, oom_lines
from jobwarden.probes.memory import MemoryWatchdog, tree_memory, tree_pss, tree_rss
from jobwarden.probes.oom import OomWatch
from tests.support import unavailable

pytestmark = pytest.mark.integration
MiB = 1 << 20
LIMIT = 64 * MiB
DEADLINE_S = 60

# Waits for "go" on stdin (so it can be put in the cgroup first), then allocates 1 MiB at a time and fills
# it: `bytes * n` writes every page, so the memory is really used, not just reserved.
HOG = "import sys\nsys.stdin.readline()\nkeep = []\nwhile True:\n    keep.append(b'x' * (1 << 20))\n"

# Allocates N MiB after each "go", saying "ready" each time; with "fork", a child shares the pages.
HOLDER = """
import os, sys
keep = []
def ready(): sys.stdout.write(f"ready {os.getpid()}\\n"); sys.stdout.flush()
ready()
for line in sys.stdin:
    if line.startswith("alloc"):
        keep.append(b"x" * (int(line.split()[1]) << 20))
    elif line.startswith("fork") and os.fork() == 0:
        ready()
        sys.stdin.readline()  # the parent's stdin: ends when the test closes it
        os._exit(0)
    ready()
"""


def read_line(proc: subprocess.Popen[str], timeout_s: float = DEADLINE_S) -> str:
    """One line from the process, a byte at a time from the fd: a buffered readline could swallow a
    second line (the forked child's and the parent's "ready" arrive together) and leave select waiting."""
    assert proc.stdout is not None
    fd, line = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    while not line.endswith(b"\n"):
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError(f"pid {proc.pid} said nothing within {timeout_s}s (got {line!r})")
        byte = os.read(fd, 1)
        if not byte:
            raise EOFError(f"pid {proc.pid} closed its output (got {line!r})")
        line += byte
    return line.decode()


@contextlib.contextmanager
def started(code: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            if stream:
                with contextlib.suppress(OSError):
                    stream.close()
        proc.wait(DEADLINE_S)


@pytest.fixture
def memory_cgroup() -> Iterator[JobCgroup]:
    if os.geteuid() != 0:
        unavailable("creating a memory cgroup needs root here (cgroup v1, or a delegated v2 subtree)")
    cgroup = create_job_cgroup(f"jobwarden-test-{uuid.uuid4().hex[:8]}")
    if cgroup is None or not cgroup.has_memory_controller:
        if cgroup:
            cgroup.remove()
        unavailable("no writable cgroup with a memory controller on this machine")
    try:
        yield cgroup
    finally:
        for pid in cgroup.pids():  # only what the test put there
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # every process the test started was reaped by then (`started`), so the cgroup is empty
        assert cgroup.remove(), f"could not remove {cgroup.path}"


def oom_kill_a_hog(cgroup: JobCgroup) -> int:
    with started(HOG) as hog:
        cgroup.procs_file.write_text(str(hog.pid))
        assert hog.stdin is not None
        hog.stdin.write("go\n")
        hog.stdin.flush()
        assert hog.wait(DEADLINE_S) == -signal.SIGKILL
        return hog.pid


# --- the cgroup limit and the OOM evidence ------------------------------------------------------------


@pytest.mark.needs_root
def test_the_kernel_kills_a_hog_at_the_limit_and_the_watch_sees_it(memory_cgroup: JobCgroup) -> None:
    memory_cgroup.set_memory_limit(LIMIT)
    watch = OomWatch(memory_cgroup)
    watch.baseline()
    assert watch.poll() is None

    victim = oom_kill_a_hog(memory_cgroup)
    evidence = watch.poll([victim])
    watch.close()

    assert evidence is not None
    assert evidence.mechanism == f"cgroup-v{memory_cgroup.version}"
    assert evidence.kills == 1
    assert evidence.limit_bytes == LIMIT
    assert evidence.peak_bytes is not None and LIMIT - 8 * MiB <= evidence.peak_bytes <= LIMIT
    if watch.kernel_log.error is None:
        assert evidence.victims == (victim,)


@pytest.mark.needs_root
def test_the_kernel_log_names_the_victim(memory_cgroup: JobCgroup) -> None:
    probe = KernelLog()
    probe.open_at_end()
    probe.close()
    if probe.error:
        unavailable(probe.error)
    memory_cgroup.set_memory_limit(LIMIT)
    watch = OomWatch(memory_cgroup)
    watch.baseline()

    victim = oom_kill_a_hog(memory_cgroup)
    evidence = watch.poll([victim])
    watch.close()

    assert evidence is not None and evidence.victims == (victim,)
    assert any(f"Killed process {victim} (python" in line for line in evidence.kernel_lines)
    assert any(f"pid={victim}," in line and "oom-kill:" in line for line in evidence.kernel_lines)


@pytest.mark.needs_root
def test_the_memory_counters_of_a_real_cgroup(memory_cgroup: JobCgroup) -> None:
    stats = memory_cgroup.memory_stats()
    assert stats is not None and stats.limit_bytes is None and stats.oom_kills == 0
    with started(HOLDER) as holder:
        read_line(holder)
        memory_cgroup.procs_file.write_text(str(holder.pid))
        assert holder.stdin is not None
        holder.stdin.write("alloc 32\n")
        holder.stdin.flush()
        read_line(holder)
        stats = memory_cgroup.memory_stats()
        assert stats is not None and stats.current_bytes is not None and stats.peak_bytes is not None
        assert stats.current_bytes >= 32 * MiB and stats.peak_bytes >= stats.current_bytes


@pytest.mark.needs_root
def test_a_limit_can_be_raised_and_lowered(memory_cgroup: JobCgroup) -> None:
    # v1 keeps memory+swap >= memory at every moment: raising must set memory+swap first, lowering last
    for limit in (LIMIT, 4 * LIMIT, LIMIT // 2):
        memory_cgroup.set_memory_limit(limit)
        stats = memory_cgroup.memory_stats()
        assert stats is not None and stats.limit_bytes == limit
        memsw = memory_cgroup.path / "memory.memsw.limit_in_bytes"
        if memory_cgroup.version == 1 and memsw.exists():
            assert int(memsw.read_text()) == limit


# --- /dev/kmsg ----------------------------------------------------------------------------------------


@pytest.mark.needs_root
def test_the_kernel_log_is_read_from_where_it_was_without_blocking() -> None:
    if os.geteuid() != 0:
        unavailable("writing a record to /dev/kmsg needs root")
    log = KernelLog()
    log.open_at_end()
    if log.error:
        unavailable(log.error)
    try:
        assert log.read_new() == []  # returns at once: nothing new
        marker = f"jobwarden test {uuid.uuid4().hex}"
        # pid 4194304 is PID_MAX_LIMIT, never a real process: nobody reading the host's log is misled
        forged = "Out of memory: Killed process 4194304 (jobwarden-test) total-vm:1kB"
        with open("/dev/kmsg", "w") as kmsg:  # root may write records (facility LOG_USER)
            kmsg.write(f"<14>{marker}\n")
            kmsg.flush()
            kmsg.write(f"<14>{forged}\n")
        records = log.read_new()
        assert [r.message for r in records] == [marker, forged]
        assert log.last_seq == records[-1].seq
        assert all(r.facility == 1 for r in records)
        assert oom_lines(records) == []  # a kill line from userspace is not believed
        assert log.read_new() == []
    finally:
        log.close()


# --- the memory of a process tree -----------------------------------------------------------------------


def test_tree_memory_sees_a_known_allocation() -> None:
    procfs = ProcFS()
    with started(HOLDER) as holder:
        read_line(holder)
        before = tree_memory(procfs, [holder.pid])
        assert holder.stdin is not None
        holder.stdin.write("alloc 64\n")
        holder.stdin.flush()
        read_line(holder)
        after = tree_memory(procfs, [holder.pid])
        pss = tree_pss(procfs, [holder.pid])
    assert abs((after - before) - 64 * MiB) <= 4 * MiB
    assert abs(pss - after) <= after // 2  # PSS shares the interpreter's libraries; the 64 MiB are its own


def test_pss_counts_pages_shared_after_fork_once() -> None:
    procfs = ProcFS()
    with started(HOLDER) as holder:
        read_line(holder)
        assert holder.stdin is not None
        holder.stdin.write("alloc 64\n")
        holder.stdin.flush()
        read_line(holder)
        holder.stdin.write("fork\n")
        holder.stdin.flush()
        replies = {read_line(holder).split()[1] for _ in range(2)}  # the child's "ready" and the parent's
        pids = [int(p) for p in replies]
        assert holder.pid in pids and len(pids) == 2
        rss, pss = tree_rss(procfs, pids), tree_pss(procfs, pids)
        exact = tree_memory(procfs, pids, exact_above=rss - 1)  # pretend the limit is just below the sum
    assert rss - pss >= 56 * MiB  # the 64 MiB counted twice by RSS, once by PSS
    assert exact == pss or abs(exact - pss) <= 2 * MiB  # over the limit, the exact sum decides
    assert MemoryWatchdog(rss - 1).check(exact) is False  # so a forked tree is not killed for its RSS sum

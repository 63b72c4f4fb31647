"""capture_stacks against real processes with the real py-spy, gdb and faulthandler."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobwarden.observations import ProcessStack, ThreadStack
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import pyspy
from jobwarden.probes.stacks import Tools, capture_stacks
from tests.conftest import make_fifo, read_fifo, wait_pid_gone, write_fifo
from tests.support import IN_CI, eventually

pytestmark = pytest.mark.integration
TARGETS = Path(__file__).parent / "jobs" / "stack_targets.py"
PROCFS = ProcFS()


@dataclass
class Target:
    proc: subprocess.Popen[bytes]
    pids: dict[str, list[int]]
    report: Path
    control: Path

    @property
    def main(self) -> int:
        return self.pids["main"][0]

    @property
    def all(self) -> list[int]:
        return self.pids["main"] + self.pids.get("child", [])

    def ping(self) -> None:
        """The process answers: it runs (not stopped, not frozen by a tracer)."""
        write_fifo(self.control, "ping\n")
        assert read_fifo(self.report, timeout_s=30) == "pong\n"


class Targets:
    """Starts target processes, each in its own session; ends every one of them and their children."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Target] = []

    def start(self, mode: str, *args: str, py_dir: Path | None = None) -> Target:
        n = len(self.started)
        report, control = make_fifo(self.tmp / f"report{n}"), make_fifo(self.tmp / f"control{n}")
        env = {**os.environ, "STACK_TARGET_PY_DIR": str(py_dir) if py_dir else ""}
        proc = subprocess.Popen(
            [sys.executable, str(TARGETS), mode, str(report), str(control), *args],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        target = Target(proc, {}, report, control)
        self.started.append(target)
        for item in read_fifo(report, timeout_s=90).split():
            key, _, pid = item.partition("=")
            target.pids.setdefault(key, []).append(int(pid))
        if mode != "dstate":  # its main thread gets to serve() only once the D state is over
            target.ping()  # an answer means its main thread is in serve() (it writes the report in main())
        return target

    def close(self) -> None:
        for target in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(target.proc.pid, signal.SIGKILL)
                os.killpg(target.proc.pid, signal.SIGCONT)
            target.proc.wait(timeout=30)
            for pid in target.all:
                wait_pid_gone(pid)


@pytest.fixture
def targets(tmp_path: Path) -> Iterator[Targets]:
    t = Targets(tmp_path)
    try:
        yield t
    finally:
        t.close()


def by_pid(stacks: list[ProcessStack]) -> dict[int, ProcessStack]:
    return {s.pid: s for s in stacks}


def thread(stack: ProcessStack, name: str) -> ThreadStack:
    (found,) = [t for t in stack.threads if t.name == name]
    return found


def main_thread(stack: ProcessStack) -> ThreadStack:
    (found,) = [t for t in stack.threads if t.tid == stack.pid]
    return found


def python_functions(t: ThreadStack) -> list[str]:
    return [f.function for f in t.frames if not f.native]


def acquire_line(name: str) -> int:
    for n, line in enumerate(TARGETS.read_text().splitlines(), 1):
        if f"# deadlock: {name} waits here" in line:
            return n
    raise AssertionError(name)


def process_state(pid: int) -> str:
    return PROCFS.stat(pid).state


# --- py-spy ------------------------------------------------------------------------------------------


def test_threads_and_child_with_native_frames(targets: Targets) -> None:
    target = targets.start("threads")
    stacks = by_pid(capture_stacks(target.all, procfs=PROCFS, timeout_s=30))
    main, child = stacks[target.main], stacks[target.pids["child"][0]]
    assert (main.method, main.error) == ("py-spy --native", None)
    assert "stack_targets.py threads" in main.cmdline
    assert {"MainThread", "sleeper", "waiter"} <= {t.name for t in main.threads}
    sleeper = thread(main, "sleeper")
    assert str(sleeper.tid) in os.listdir(f"/proc/{target.main}/task")
    assert sleeper.state == "S" and sleeper.active is False
    # innermost first: the C sleep, then nap, then the threading machinery
    assert sleeper.frames[0].native
    assert python_functions(sleeper)[:2] == ["nap", "Thread.run"]
    nap = next(f for f in sleeper.frames if f.function == "nap")
    assert nap.file == str(TARGETS) and nap.line is not None
    assert python_functions(thread(main, "waiter"))[0] == "Condition.wait"
    assert python_functions(thread(main, "MainThread"))[0] == "serve"
    assert child.method == "py-spy --native"
    assert python_functions(main_thread(child))[0] == "child_main"
    target.ping()


def test_without_native_only_python_frames(targets: Targets) -> None:
    target = targets.start("threads")
    (stack,) = capture_stacks([target.main], procfs=PROCFS, native=False, timeout_s=30)
    assert stack.method == "py-spy"
    python_threads = [t for t in stack.threads if t.frames]
    assert python_threads and all(not f.native for t in python_threads for f in t.frames)
    assert python_functions(thread(stack, "sleeper"))[0] == "nap"


def test_deadlocked_threads_show_where_they_wait(targets: Targets) -> None:
    target = targets.start("deadlock")
    (stack,) = capture_stacks([target.main], procfs=PROCFS, timeout_s=30)
    assert stack.method == "py-spy --native"
    for name, function in (("left", "take_left_then_right"), ("right", "take_right_then_left")):
        t = thread(stack, name)
        innermost_python = next(f for f in t.frames if not f.native)
        assert (innermost_python.function, innermost_python.line) == (function, acquire_line(name))
        assert t.state == "S" and t.active is False
        # the native frames above it are the lock wait itself
        assert t.frames[0].native


def test_stopped_process_is_read_without_pausing_and_left_stopped(targets: Targets) -> None:
    target = targets.start("threads")
    os.kill(target.main, signal.SIGSTOP)
    assert _wait_all_stopped(target.main)
    started = time.monotonic()
    (stack,) = capture_stacks([target.main], procfs=PROCFS, timeout_s=30)
    assert time.monotonic() - started < 15  # nothing waited for a deadline
    assert stack.method == "py-spy --nonblocking"
    assert "stopped" in (stack.error or "")
    assert "could not pause" not in (stack.error or "")  # no blocking dump was even tried
    assert python_functions(thread(stack, "sleeper"))[0] == "nap"
    assert {t.state for t in stack.threads} == {"T"}
    # still stopped, nobody tracing it, no stop left pending: once continued, it works at once
    assert process_state(target.main) == "T"
    assert _status_field(target.main, "TracerPid") == "0"
    os.kill(target.main, signal.SIGCONT)
    target.ping()
    assert process_state(target.main) in ("S", "R")


def test_a_thread_in_d_state_is_never_paused(targets: Targets, tmp_path: Path) -> None:
    """A blocking dump would hang on the D-state thread, freezing the others meanwhile; the capture reads
    without pausing at once, shows the thread in D and where it waits, and leaves nothing behind."""
    release = make_fifo(tmp_path / "release")
    target = targets.start("dstate", str(release))
    spawner = _wait_thread_state(target.main, "D")
    started = time.monotonic()
    (stack,) = capture_stacks([target.main], procfs=PROCFS, timeout_s=20)
    assert time.monotonic() - started < 8  # no blocking attempt waited out its share of the deadline
    assert stack.method == "py-spy --nonblocking"
    error = stack.error or ""
    assert f"thread {spawner} (in " in error and "uninterruptible sleep (D)" in error
    assert "no answer" not in error
    blocked = thread(stack, "spawner")
    assert (blocked.tid, blocked.state) == (spawner, "D")
    assert python_functions(blocked)[:2] == ["spawn_blocked", "Thread.run"]
    assert _status_field(target.main, "TracerPid") == "0"
    # once the kernel lets the thread go, the process runs on as if nothing had looked at it
    fd = os.open(release, os.O_WRONLY | os.O_NONBLOCK)  # the spawned child waits in open(): a reader
    os.close(fd)
    target.ping()


def _thread_states(pid: int) -> dict[int, str]:
    states = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            states[int(tid)] = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()[0]
    return states


def _wait_thread_state(pid: int, state: str, timeout_s: float = 30) -> int:
    """The first thread of `pid` seen in `state` (the kernel's view is the handshake here)."""
    return eventually(
        f"a thread of {pid} in state {state}",
        lambda: next((tid for tid, s in _thread_states(pid).items() if s == state), None),
        timeout_s,
        every_s=0.01,
    )


def _wait_state(pid: int, state: str, timeout_s: float = 30) -> bool:
    return eventually(f"process {pid} in state {state}", lambda: process_state(pid) == state, timeout_s, 0.01)


def _wait_all_stopped(pid: int, timeout_s: float = 30) -> bool:
    """Every thread in group stop (each enters it on its own, shortly after the SIGSTOP)."""
    return eventually(
        f"every thread of {pid} stopped", lambda: set(_thread_states(pid).values()) == {"T"}, timeout_s, 0.01
    )


def _status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(name)


# --- faulthandler fallback -----------------------------------------------------------------------------


@pytest.fixture
def no_py_spy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pyspy.PY_SPY_ENV, "/nonexistent/py-spy")


def test_faulthandler_when_py_spy_is_missing(targets: Targets, tmp_path: Path, no_py_spy: None) -> None:
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    target = targets.start("threads", py_dir=py_dir)
    (stack,) = capture_stacks([target.main], procfs=PROCFS, py_dir=py_dir, timeout_s=30)
    assert stack.method == "faulthandler", stack.error
    assert "py-spy not found" in (stack.error or "")
    firsts = {python_functions(t)[0] for t in stack.threads if t.frames}
    assert {"nap", "serve"} <= firsts
    assert any(python_functions(t)[:1] == ["wait"] for t in stack.threads)
    target.ping()  # the signal was handled: the process lives on
    # a second dump reads only what the second signal added
    (again,) = capture_stacks([target.main], procfs=PROCFS, py_dir=py_dir, timeout_s=30)
    assert len(again.threads) == len(stack.threads)


def test_faulthandler_shows_a_deadlock(targets: Targets, tmp_path: Path, no_py_spy: None) -> None:
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    target = targets.start("deadlock", py_dir=py_dir)
    (stack,) = capture_stacks([target.main], procfs=PROCFS, py_dir=py_dir, timeout_s=30)
    assert stack.method == "faulthandler"
    innermost = {(t.frames[0].function, t.frames[0].line) for t in stack.threads if t.frames}
    assert ("take_left_then_right", acquire_line("left")) in innermost
    assert ("take_right_then_left", acquire_line("right")) in innermost


def test_faulthandler_reads_a_process_with_a_thread_in_d_state(
    targets: Targets, tmp_path: Path, no_py_spy: None
) -> None:
    """The stuck thread holds the GIL in the kernel; faulthandler's C handler runs in another thread."""
    py_dir, release = tmp_path / "py", make_fifo(tmp_path / "release")
    py_dir.mkdir()
    target = targets.start("dstate", str(release), py_dir=py_dir)
    _wait_thread_state(target.main, "D")
    (stack,) = capture_stacks([target.main], procfs=PROCFS, py_dir=py_dir, timeout_s=30)
    assert stack.method == "faulthandler", stack.error
    assert "uninterruptible sleep (D)" in (stack.error or "")
    assert len(stack.threads) == 2
    assert "spawn_blocked" in {python_functions(t)[0] for t in stack.threads}
    os.close(os.open(release, os.O_WRONLY | os.O_NONBLOCK))
    target.ping()


def test_an_unadvertised_process_is_never_signalled(
    targets: Targets, tmp_path: Path, no_py_spy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR2's default action kills: a process without the hook, or a pid whose advert is from an
    earlier process (another start time), must not get it."""
    monkeypatch.setenv("JOBWARDEN_GDB", "/nonexistent/gdb")
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    bare, stale = targets.start("plain"), targets.start("plain")
    start, exe = PROCFS.stat(stale.main).start_time, os.stat(f"/proc/{stale.main}/exe")
    (py_dir / f"{stale.main}.json").write_text(
        f'{{"pid": {stale.main}, "start_time": {start - 1}, "python": "3", "executable": "python", '
        f'"fault_signal": {int(signal.SIGUSR2)}, "fault_file": "{py_dir}/x.fault", "ptracer": false, '
        f'"mp_start": null, "exe": [{exe.st_dev}, {exe.st_ino}], "fault_fd": 3, "fault_file_id": [0, 0]}}'
    )
    stacks = by_pid(capture_stacks([bare.main, stale.main], procfs=PROCFS, py_dir=py_dir, timeout_s=10))
    assert stacks[bare.main].method == "none"
    assert "py-spy not found" in (stacks[bare.main].error or "")
    assert "gdb is not installed" in (stacks[bare.main].error or "")
    assert stacks[stale.main].method == "none"
    assert "earlier process" in (stacks[stale.main].error or "")
    bare.ping()
    stale.ping()


def test_a_stopped_process_is_not_signalled(targets: Targets, tmp_path: Path, no_py_spy: None) -> None:
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    target = targets.start("plain", py_dir=py_dir)
    os.kill(target.main, signal.SIGSTOP)
    assert _wait_state(target.main, "T")
    (stack,) = capture_stacks([target.main], procfs=PROCFS, py_dir=py_dir, timeout_s=10)
    assert stack.method == "none"
    assert "stopped" in (stack.error or "")
    assert _status_field(target.main, "SigPnd") == _status_field(target.main, "ShdPnd") == "0" * 16
    assert process_state(target.main) == "T"
    os.kill(target.main, signal.SIGCONT)
    target.ping()
    assert (py_dir / f"{target.main}.fault").read_text() == ""  # no dump happened later either


# --- gdb and the rest ----------------------------------------------------------------------------------


# gdb is a Debian package scripts/test installs: missing, skipped on a developer's machine, never in CI
needs_gdb = pytest.mark.skipif(not IN_CI and Tools.find().gdb is None, reason="gdb is not installed")


@needs_gdb
def test_a_non_python_process_through_gdb(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    try:
        _wait_state(proc.pid, "S")
        (stack,) = capture_stacks([proc.pid], procfs=PROCFS, timeout_s=30)
        assert (stack.method, stack.error) == ("gdb", None)
        (t,) = stack.threads
        assert t.tid == proc.pid and t.state == "S"
        assert all(f.native for f in t.frames)
        assert any("sleep" in f.function for f in t.frames[:3]), t.frames
        assert len(t.frames) >= 3  # coreutils' sleep is stripped: its own frames show as ??
        assert stack.cmdline == "sleep 3600"
        assert process_state(proc.pid) == "S" and _status_field(proc.pid, "TracerPid") == "0"
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_is_gone() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    (stack,) = capture_stacks([proc.pid], procfs=PROCFS, timeout_s=5)
    assert stack.method == "none" and "exited" in (stack.error or "")


def test_a_tree_of_32_processes_in_parallel(targets: Targets) -> None:
    target = targets.start("tree", "32")
    assert len(target.all) == 32
    started = time.monotonic()
    stacks = capture_stacks(target.all, procfs=PROCFS, native=False, timeout_s=20)
    elapsed = time.monotonic() - started
    assert [s.pid for s in stacks] == target.all
    assert {s.method for s in stacks} == {"py-spy"}, [s.error for s in stacks if s.error]
    children = [s for s in stacks if s.pid != target.main]
    assert all(python_functions(main_thread(s))[0] == "child_main" for s in children)
    assert elapsed < 20


def test_the_time_bound_holds_when_every_tool_hangs(targets: Targets, tmp_path: Path) -> None:
    """32 dumps whose tool never answers: all end at the shared deadline, each tool killed and reaped."""
    marker = f"hung-tool-{os.getpid()}-{tmp_path.name}"
    hung = tmp_path / "py-spy"
    hung.write_text(
        f"#!{sys.executable}\nimport subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)', '{marker}'])\n"
        "time.sleep(3600)\n"
    )
    hung.chmod(0o755)
    target = targets.start("tree", "32")
    tools = Tools(py_spy=hung, gdb=None)
    started = time.monotonic()
    stacks = capture_stacks(target.all, procfs=PROCFS, timeout_s=2.0, tools=tools)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0 + 8  # the deadline, plus killing and reaping 64 processes on a loaded machine
    assert all(s.method == "none" and "no answer" in (s.error or "") for s in stacks)
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(int(p), marker)]
    assert leftover == []
    target.ping()


def _cmdline_has(pid: int, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False

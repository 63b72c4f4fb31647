"""Shared test helpers. Integration tests get an isolated JOBWARDEN_HOME and a CLI runner; whatever a test
leaves running under that home is killed afterwards, and the test fails: no test may leak a process."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.support import eventually, unavailable

# Property tests: no per-example deadline (a loaded 2-core machine is slow, and a slow example is not a
# wrong one) and no example database written into the checkout
settings.register_profile("jobwarden", deadline=None, database=None)
settings.load_profile("jobwarden")

CLI_TIMEOUT_S = 90  # generous: a loaded 2-core machine is slow, but a hang still ends the test


CLONE = Path(__file__).resolve().parents[1]  # the checkout the tests run from


def venv_pip() -> str:
    """The pip beside the interpreter that runs the tests, as typed from the clone (`.venv/bin/pip`)."""
    pip = Path(sys.executable).parent / "pip"
    return str(pip.relative_to(CLONE)) if pip.is_relative_to(CLONE) else str(pip)


class Jobwarden:
    """Runs the real CLI in a subprocess against one home."""

    def __init__(self, home: Path, tmp: Path) -> None:
        self.home = home
        self.tmp = tmp
        # a config file of the user running the tests must not change what `run` does in them
        self.env = {
            **os.environ,
            "JOBWARDEN_HOME": str(home),
            "NO_COLOR": "1",
            "XDG_CONFIG_HOME": str(tmp / "config"),
        }
        self.env.pop("JOBWARDEN_JOB_ID", None)

    def __call__(
        self, *args: str, check: bool = False, timeout: float = CLI_TIMEOUT_S, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "jobwarden", *args],
            env=self.env,
            text=True,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"jobwarden {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self(args[0], "--json", *args[1:], check=True).stdout)

    def start(self, *command: str, options: tuple[str, ...] = ()) -> dict[str, Any]:
        """`run --json`, returning its answer."""
        return dict(self.json("run", *options, "--", *command))

    def status(self, job: int | str) -> dict[str, Any]:
        return dict(self.json("status", str(job)))

    def output(self, job: int | str, run: int = 1) -> str:
        return (self.home / "jobs" / str(job) / f"run-{run}" / "output.log").read_text()


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def read_fifo(path: Path, timeout_s: float = 60, lines: int = 1) -> str:
    """Block until jobs write `lines` newline-terminated messages to the FIFO (a handshake with a
    deadline), all read through one opening: a line written between a read and the close would be lost
    with the pipe's buffer once no reader holds it (three ranks announcing at once lost two that way).

    Opened O_RDWR so the open itself never blocks and a writer's close is not mistaken for the end."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    data = b""
    deadline = time.monotonic() + timeout_s
    try:
        while not (data.endswith(b"\n") and data.count(b"\n") >= lines):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError(f"no message on {path} within {timeout_s}s (got {data!r})")
            data += os.read(fd, 65536)
    finally:
        os.close(fd)
    return data.decode()


def write_fifo(path: Path, text: str = "go\n", timeout_s: float = 60) -> None:
    def opened() -> list[int] | None:  # the descriptor in a list: 0 is one too
        try:
            return [os.open(path, os.O_WRONLY | os.O_NONBLOCK)]
        except OSError:  # ENXIO: no reader yet
            return None

    (fd,) = eventually(f"a reader of {path}", opened, timeout_s, every_s=0.01)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def wait_pid_gone(pid: int, timeout_s: float = 30) -> None:
    """Block on a pidfd until `pid` has exited (works for non-children)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if not select.select([fd], [], [], timeout_s)[0]:
            raise TimeoutError(f"pid {pid} still alive after {timeout_s}s")
    finally:
        os.close(fd)


def kill_shim(jw: Jobwarden, job_id: int) -> int:
    """SIGKILL a job's supervisor (through a pidfd) and wait until it is gone; returns its pid."""
    shim = jw.status(job_id)["shim_pid"]
    fd = os.pidfd_open(shim)
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)
    wait_pid_gone(shim)
    return int(shim)


def start_time(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rpartition(")")[2].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(pid: int, start: int) -> bool:
    return start_time(pid) == start


def processes_under(home: Path) -> list[int]:
    """Pids of live processes started with JOBWARDEN_HOME=home (shims and jobs alike)."""
    marker = f"JOBWARDEN_HOME={home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in env.split(b"\0") and start_time(int(entry)) is not None:
            found.append(int(entry))
    return found


def require_kernel_process_events() -> None:
    """Skip where the kernel will not send its process events (a container); in CI, fail instead: the
    machines CI runs on offer them, and the tests that need them must not pass silently."""
    from jobwarden.osapi.procevents import probe

    available, why = probe()
    if not available:
        unavailable(why)


@pytest.fixture
def jw(tmp_path: Path) -> Iterator[Jobwarden]:
    home = tmp_path / "home"
    runner = Jobwarden(home, tmp_path)
    yield runner
    leaked = processes_under(home)
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in leaked:
        wait_pid_gone(pid)
    if leaked:
        pytest.fail(f"the test left processes running: {leaked}")


# A terminal's size comes from the terminal: pytest-xdist's workers export COLUMNS=80 and LINES=24, which
# every job and `top` in a tmux the tests start would take over the tmux window's own size
for _fixed_size in ("COLUMNS", "LINES"):
    os.environ.pop(_fixed_size, None)

# Tests that share one throwaway cluster (a session's Slurm, the Ray namespace, the container root file
# system's podman) run on one worker when the suite runs in parallel (scripts/test: pytest-xdist,
# --dist loadgroup): a second worker would start a second cluster on the same ports and paths
_ONE_WORKER_GROUPS = ("slurm", "ray", "container")
# Tests that judge speed run `alone`, after the parallel part, on a machine that runs nothing else of the
# suite: the speed rules' real jobs measure CPU shares and run-queue delays (a second worker's load made a
# DataLoader's two spawned workers look like one), the straggler across Slurm nodes too. Slurm's other
# tests run in the parallel part again: their OOM test's `exit-code` was pyenv's helpers' exits before
# the kill, whatever the load (rules.causal), not the load.
_ALONE_MODULES = (
    "test_speed.py",
    "test_speed_loading.py",
    "test_speed_threads.py",
    "test_speed_ranks.py",
    "test_straggler_across_nodes.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for group in _ONE_WORKER_GROUPS:
            if item.get_closest_marker(group) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
        # the real jobs only: the unit tests of the same names compute on fakes, whatever the load
        if item.path.name in _ALONE_MODULES and "unit" not in item.path.parts:
            item.add_marker(pytest.mark.alone)


# Figures the tests measured, by topic ("ray": {what: seconds}), shown at the end of the session. Under
# pytest-xdist each worker hands its own to the controller, which shows them all.
MEASURED: dict[str, dict[str, float]] = {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["measured"] = json.dumps(MEASURED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: a worker ended, with what it measured."""
    for topic, figures in json.loads(getattr(node, "workeroutput", {}).get("measured", "{}")).items():
        MEASURED.setdefault(topic, {}).update(figures)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for topic, figures in MEASURED.items():
        for what, seconds in figures.items():
            terminalreporter.write_line(f"{topic}: {what}: {seconds:.2f}")

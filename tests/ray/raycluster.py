"""A throwaway Ray cluster for the tests: a head and a second raylet, loopback only, inside their own
network, pid and mount namespaces (docs/cluster.md). Every command of a test that talks to Ray, or to a
jobwarden whose pids live in the namespace, runs in there through `nsenter`. Closing the namespace's
init ends them all at once (the kernel kills a pid namespace with its init), so no `ray stop` and no
process hunt is needed, and nothing leaks even when a test fails midway."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

NSINIT = Path(__file__).with_name("nsinit.py")
GCS_PORT = 6379  # outside Ray's worker-port range (10002-19999), which refuses a GCS port at start
DASHBOARD = "http://127.0.0.1:8265"
START_TIMEOUT_S = 240.0  # a head takes 5-21 s here; a loaded 2-core CI machine is slower
# Ray's stop wait, raised from its default 3 s so that a test's stop is judged by the shim's budget
# (the shim reads it as the engine's budget; docs/cluster.md)
STOP_WAIT_S = 8


class RayNamespace:
    """The namespaces (through their init's pid) and the cluster in them."""

    def __init__(self, bin_dir: Path) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="jwray-"))  # short: Ray's unix sockets live under it
        self.bin_dir = bin_dir
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_S),
            "RAY_ADDRESS": DASHBOARD,  # `ray job ...` find the head by it; drivers get their own from Ray
            # Ray turns token auth on by itself when ~/.ray/auth_token exists (Ray 2.60 writes one at the
            # first local ray.init()), and then refuses its own clients here: this cluster is loopback only,
            # inside its own network namespace, so it does without, whatever the machine's home holds
            "RAY_AUTH_MODE": "disabled",
        }
        self.env.pop("JOBWARDEN_JOB_ID", None)
        self.init_pid = 0
        self._unshare: subprocess.Popen[bytes] | None = None
        self._node2: subprocess.Popen[bytes] | None = None
        self.head_start_s = 0.0

    # --- the namespace -------------------------------------------------------------------------------

    def open(self) -> None:
        self._unshare = subprocess.Popen(
            ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, NSINIT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._unshare.stdout is not None
        _expect_line(self._unshare.stdout, b"up\n", 30.0, "the namespace's init")
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children").read_text().split()
        self.init_pid = int(children[0])

    def close(self) -> None:
        """Closing the init's stdin ends it, and with it every process in the namespace."""
        if self._unshare is not None:
            assert self._unshare.stdin is not None
            self._unshare.stdin.close()
            try:
                self._unshare.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._unshare.kill()  # --kill-child: unshare's death SIGKILLs the init
                self._unshare.wait()
            if self._unshare.stdout is not None:
                self._unshare.stdout.close()
        if self._node2 is not None:  # ended with the namespace if it was still starting; reap its nsenter
            self._node2.kill()
            self._node2.communicate()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv as run inside the namespaces (network, pid and the mount that holds their /proc)."""
        enter = ["nsenter", f"--target={self.init_pid}", "--net", "--pid", "--mount", f"--wd={os.getcwd()}"]
        return [*enter, "--", *argv]

    def run(
        self, *argv: str, env: Mapping[str, str] | None = None, timeout: float = 120.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.command(argv),
            env={**self.env, **(env or {})},
            text=True,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *argv: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(argv),
            env={**self.env, **(env or {})},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    # --- the cluster ---------------------------------------------------------------------------------

    def start_head(self) -> None:
        began = time.monotonic()
        self.run(
            "ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={GCS_PORT}",
            "--dashboard-host=127.0.0.1", "--dashboard-port=8265", "--ray-client-server-port=10001",
            "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={self.tmp / 'ray'}",
            timeout=START_TIMEOUT_S, check=True,
        )  # fmt: skip
        self.head_start_s = time.monotonic() - began

    def start_second_node(self) -> None:
        """The second raylet starts in the background: the tests of one node run meanwhile, and the
        first test that needs two waits for it (nodes_alive)."""
        self._node2 = self.popen(
            "ray", "start", f"--address=127.0.0.1:{GCS_PORT}", "--node-ip-address=127.0.0.1",
            "--num-cpus=1", "--disable-usage-stats",
        )  # fmt: skip

    def wait_second_node(self) -> None:
        assert self._node2 is not None, "start_second_node first"
        out, _ = self._node2.communicate(timeout=START_TIMEOUT_S)
        if self._node2.returncode != 0:
            raise AssertionError(f"the second raylet did not start:\n{out}")


def _expect_line(stream: IO[bytes], line: bytes, timeout_s: float, who: str) -> None:
    deadline = time.monotonic() + timeout_s
    got = b""
    fd = stream.fileno()
    while not got.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError(f"{who} said nothing within {timeout_s}s")
        chunk = os.read(fd, 1)
        if not chunk:
            raise AssertionError(f"{who} exited before saying {line!r} (got {got!r})")
        got += chunk
    if got != line:
        raise AssertionError(f"{who} said {got!r}, not {line!r}")

"""A throwaway Slurm for the tests and benchmarks: munge, slurmctld and two slurmd (`-N n1`, `-N n2`, each
on its own port, loopback only) from Debian's slurm-wlm and munge, all in one temporary directory.

The daemons run under a *keeper* (tests/slurmkeeper.py, a child subreaper that starts them in the
foreground, reaps them and everything orphaned under them, and on SIGTERM stops them, kills what is left
and reaps it). So a test session only starts the keeper, waits for its "ready" line, and stops it by pid.

    python tests/slurmcluster.py [--kill-wait S] -- COMMAND...   # a cluster for one command (SLURM_CONF set)

Settings (docs/cluster.md, research §4.1): KillWait=5, RequeueExit=200 (a requeue code must be above a
collateral 143), cred_expire=10 and sched_interval=2 (a requeued job restarts in ~15 s, not minutes),
DefMemPerCPU=500 (jobs share the nodes), proctrack/cgroup + task/cgroup with ConstrainRAMSpace (Slurm's
OOM accounting), jobcomp/filetxt (the tests read how jobs ended from it). Job ids start at a random
FirstJobId: two clusters on one host (two test sessions) never share a job's cgroup path.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support import eventually

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "sinfo")
NODES = ("n1", "n2")
READY_TIMEOUT_S = 60.0
KEEPER = Path(__file__).with_name("slurmkeeper.py")


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]


class SlurmCluster:
    """The test side: start the keeper, talk to Slurm through its commands, stop the keeper."""

    def __init__(self, root: Path, kill_wait: int = 5, nodes: Sequence[str] = NODES) -> None:
        self.root, self.kill_wait, self.nodes = root, kill_wait, tuple(nodes)
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for var in [v for v in self.env if v.startswith(("SLURM_", "SLURMD_")) and v != "SLURM_CONF"]:
            del self.env[var]  # a test session run inside Slurm must not pass its own job to ours
        self.keeper: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None

    # --- lifetime ---------------------------------------------------------------------------------

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        began = time.monotonic()
        cmd = [sys.executable, str(KEEPER), "--kill-wait", str(self.kill_wait)]
        self.keeper = subprocess.Popen(
            [*cmd, "--nodes", ",".join(self.nodes), str(self.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.keeper.stdout is not None
        line = _read_line(self.keeper.stdout.fileno(), timeout_s)
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError(f"the throwaway Slurm did not start: {line.strip()!r}\n{self.logs()}")
        self.started_s = time.monotonic() - began

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.keeper is None or self.keeper.poll() is not None:
            return
        self.keeper.send_signal(signal.SIGTERM)
        try:
            self.keeper.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.keeper.kill()
            self.keeper.wait()
        if self.keeper.stdout:
            self.keeper.stdout.close()

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            parts.append(
                f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            )
        return "\n".join(parts)

    # --- Slurm's commands -------------------------------------------------------------------------

    def command(
        self, *argv: str, env: Mapping[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env={**self.env, **(env or {})},
            text=True,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )

    def srun(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.command("srun", *args, env=env, timeout=timeout, cwd=cwd)

    def srun_async(
        self, *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[str]:
        """srun in the background (its output in pipes): for a job a test signals while it runs."""
        return subprocess.Popen(
            ["srun", *args],
            env={**self.env, **(env or {})},
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
        )

    def sbatch(
        self, script: str, *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> int:
        """Submit `script` (its text); returns the job id."""
        path = Path(tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.root)[1])
        path.write_text(script)
        done = self.command("sbatch", "--parsable", *args, str(path), env=env, cwd=cwd)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def scancel(self, *args: str) -> None:
        done = self.command("scancel", *args)
        if done.returncode != 0:
            raise RuntimeError(f"scancel {' '.join(args)} failed: {done.stderr.strip()}")

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -o ID` as fields ({} once Slurm has forgotten the job)."""
        done = self.command("scontrol", "show", "job", "-o", str(job_id))
        return _fields(done.stdout) if done.returncode == 0 else {}

    def jobcomp(self) -> list[dict[str, str]]:
        """Every job end recorded so far (jobcomp/filetxt), oldest first; a requeued job has several."""
        try:
            text = (self.root / "jobcomp.txt").read_text()
        except FileNotFoundError:
            return []
        return [_fields(line) for line in text.splitlines() if line.strip()]

    def wait_job(self, job_id: int, timeout_s: float = 120, ends: int = 1) -> dict[str, str]:
        """Poll jobcomp until the job has ended `ends` times (a requeue ends it once per attempt); its
        latest end record (JobState, ExitCode "3:0", ...)."""

        def ended() -> dict[str, str] | None:
            found = [r for r in self.jobcomp() if r.get("JobId") == str(job_id)]
            return found[-1] if len(found) >= ends else None

        return eventually(f"Slurm job {job_id} ended {ends}x", ended, timeout_s, every_s=0.1)

    def wait_state(self, job_id: int, states: Sequence[str], timeout_s: float = 60) -> dict[str, str]:
        """Poll `scontrol show job` until the job is in one of `states` (RUNNING, PENDING...)."""

        def in_state() -> dict[str, str] | None:
            fields = self.job(job_id)
            return fields if fields.get("JobState") in states else None

        return eventually(f"Slurm job {job_id} in {states}", in_state, timeout_s, every_s=0.1)


def _fields(text: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", text))


def _read_line(fd: int, timeout_s: float) -> str:
    data = b""
    deadline = time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return data.decode(errors="replace") or f"no answer in {timeout_s:g}s"
        chunk = os.read(fd, 4096)
        if not chunk:
            return data.decode(errors="replace") or "the keeper exited"
        data += chunk
    return data.decode(errors="replace")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kill-wait", type=int, default=5)
    parser.add_argument("--nodes", default=",".join(NODES))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --, e.g. -- srun -N2 hostname")
    root = Path(tempfile.mkdtemp(prefix="jw-slurm-"))
    cluster = SlurmCluster(root, args.kill_wait, args.nodes.split(","))
    try:
        cluster.start()
        print(f"slurm up in {cluster.started_s:.2f}s: SLURM_CONF={cluster.conf}", file=sys.stderr)
        return subprocess.run(command, env=cluster.env).returncode
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A throwaway Slurm for the tests and benchmarks: munge, slurmctld and two slurmd (`-N n1`, `-N n2`, each
on its own port, loopback only) from Debian's slurm-wlm and munge, all in one temporary directory.

The daemons run under a *keeper*: this file run as a script (`keep DIR`), a child subreaper that starts
them in the foreground, reaps them and everything orphaned under them (slurmstepd daemonises; PID 1 does
not reap here), and on SIGTERM stops them, kills what is left and reaps it before it exits. So a test
session only starts the keeper, waits for its "ready" line, and stops it by pid.

    python tests/slurmcluster.py [--kill-wait S] -- COMMAND...   # a cluster for one command (SLURM_CONF set)

Settings (docs/cluster.md, research §4.1): KillWait=5, RequeueExit=200 (a requeue code must be above a
collateral 143), cred_expire=10 and sched_interval=2 (a requeued job restarts in ~15 s, not minutes),
DefMemPerCPU=500 (jobs share the nodes), proctrack/cgroup + task/cgroup with ConstrainRAMSpace (Slurm's
OOM accounting), jobcomp/filetxt (the tests read how jobs ended from it). Job ids start at a random
FirstJobId: two clusters on one host (two test sessions) never share a job's cgroup path.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "sinfo")
NODES = ("n1", "n2")
READY_TIMEOUT_S = 60.0
_PR_SET_CHILD_SUBREAPER = 36


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_config(root: Path, kill_wait: int, nodes: Sequence[str] = NODES) -> Path:
    """slurm.conf and cgroup.conf under `root`; returns the slurm.conf path."""
    for sub in ("state", "spool", "log", "run", "munge", "munge-run"):
        (root / sub).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    ctld_port, *node_ports = _free_ports(1 + len(nodes))
    lines = [
        "ClusterName=jwtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge-run/munge.socket.2,cred_expire=10",
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={root}/jobcomp.txt",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=500",
        f"KillWait={kill_wait}",
        "RequeueExit=200",
        "SchedulerParameters=sched_interval=2",
        "MpiDefault=none",
        "ReturnToService=2",
        "InactiveLimit=0",
        "MinJobAge=300",
        f"FirstJobId={random.randrange(1000, 1_000_000, 1000)}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, port in zip(nodes, node_ports, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=2 RealMemory=2000 "
            "State=UNKNOWN"
        )
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    (root / "cgroup.conf").write_text(
        "CgroupPlugin=autodetect\nConstrainRAMSpace=yes\nConstrainSwapSpace=no\n"
    )
    return conf


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
        cmd = [sys.executable, __file__, "keep", "--kill-wait", str(self.kill_wait)]
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
        deadline = time.monotonic() + timeout_s
        while True:
            found = [r for r in self.jobcomp() if r.get("JobId") == str(job_id)]
            if len(found) >= ends:
                return found[-1]
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Slurm job {job_id} did not end {ends}x in {timeout_s}s: {self.job(job_id)}"
                )
            time.sleep(0.1)

    def wait_state(self, job_id: int, states: Sequence[str], timeout_s: float = 60) -> dict[str, str]:
        """Poll `scontrol show job` until the job is in one of `states` (RUNNING, PENDING...)."""
        deadline = time.monotonic() + timeout_s
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm job {job_id} not in {states} after {timeout_s}s: {fields}")
            time.sleep(0.1)


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


# --- the keeper (this file run as a script) -----------------------------------------------------------


class _Stop(Exception):
    pass


def _on_term(signum: int, frame: Any) -> None:
    raise _Stop


def _spawn(argv: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=dict(env))


def _start_munge(root: Path) -> subprocess.Popen[bytes]:
    key = root / "munge" / "munge.key"
    subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
    shutil.chown(root / "munge", "munge", "munge")
    shutil.chown(root / "munge-run", "munge", "munge")
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    argv = ["runuser", "-u", "munge", "--", "munged", "-F", f"--key-file={key}"]
    argv += [f"--socket={root}/munge-run/munge.socket.2", f"--pid-file={root}/munge-run/munged.pid"]
    argv += [f"--log-file={root}/munge/munged.log", f"--seed-file={root}/munge/seed"]
    return _spawn(argv, root / "log" / "munge-stdout.log", os.environ)


def _wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout_s:g}s")
        time.sleep(0.05)


def _nodes_idle(env: Mapping[str, str], count: int) -> bool:
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=dict(env), capture_output=True, text=True)
    states = [line.split()[-1] for line in done.stdout.splitlines() if line.strip()]
    return done.returncode == 0 and len(states) == count and all(s == "idle" for s in states)


def keep(root: Path, kill_wait: int, nodes: Sequence[str]) -> int:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    root.chmod(0o755)  # munged runs as user munge: it must reach its directories
    conf = write_config(root, kill_wait, nodes)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        daemons.append(_start_munge(root))
        socket_path = root / "munge-run" / "munge.socket.2"
        _wait_for(socket_path.exists, 20, "munged")
        daemons.append(_spawn(["slurmctld", "-D", "-i"], root / "log" / "slurmctld-stdout.log", env))
        for name in nodes:
            daemons.append(
                _spawn(["slurmd", "-D", "-N", name], root / "log" / f"slurmd-{name}-stdout.log", env)
            )
        _wait_for(lambda: _nodes_idle(env, len(nodes)), READY_TIMEOUT_S - 5, "the nodes")
        print("ready", flush=True)
        while True:  # reap whatever ends under us until asked to stop
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                signal.pause()
    except _Stop:
        pass
    except Exception as err:  # said on the ready line
        print(f"error: {err}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _shutdown(daemons)
    return 0


def _shutdown(daemons: list[subprocess.Popen[bytes]]) -> None:
    """slurmd first, slurmctld, munged last (SIGTERM, then SIGKILL); then every orphan left under us."""
    for proc in reversed(daemons):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for _ in range(50):
        children = _children(os.getpid())
        if not children:
            break
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap_all(0.2)
    _reap_all(0)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _reap_all(wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kill-wait", type=int, default=5)
    parser.add_argument("--nodes", default=",".join(NODES))
    if argv[:1] == ["keep"]:  # the keeper, started by SlurmCluster.start
        parser.add_argument("root")
        args = parser.parse_args(argv[1:])
        return keep(Path(args.root), args.kill_wait, args.nodes.split(","))
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

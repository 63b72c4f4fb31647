"""The keeper of the throwaway Slurm (tests/slurmcluster.py): run as a script by SlurmCluster.start, it
writes slurm.conf and cgroup.conf into its directory, becomes a child subreaper, starts munged, slurmctld
and the slurmd in the foreground, prints "ready" once every node is idle (or "error: ..."), reaps whatever
ends under it (slurmstepd daemonises; PID 1 does not reap here), and on SIGTERM stops the daemons, kills
what is left under it and reaps it before it exits.

    python tests/slurmkeeper.py [--kill-wait S] [--nodes n1,n2] DIR

Standard library only: it runs as a script, outside the test package.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

NODES = ("n1", "n2")
READY_TIMEOUT_S = 60.0
_PR_SET_CHILD_SUBREAPER = 36


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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kill-wait", type=int, default=5)
    parser.add_argument("--nodes", default=",".join(NODES))
    parser.add_argument("root")
    args = parser.parse_args(argv)
    return keep(Path(args.root), args.kill_wait, args.nodes.split(","))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

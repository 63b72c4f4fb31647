"""Where this process stands in a container, and its duties when it is the container's init.

A container runtime starts one process, the container's main process, as PID 1 of a new pid namespace (or
under an init it adds: `docker run --init`'s tini, podman's catatonit). PID 1 has two duties no other process
has (pid_namespaces(7)):

- it inherits every orphan in the namespace: a process whose parent exits is reparented to it, and stays a
  zombie until it reaps it. `exec` probes and `kubectl exec` leave such orphans (`sh -c 'cmd &'`), so a
  PID 1 that only waits for its own child fills the process table with zombies over a pod's life;
- the kernel drops every signal whose action is the default (SIGTERM, SIGINT...) sent to it from inside
  the namespace, and from outside (the runtime's stop) all but SIGKILL: a PID 1 without a handler ignores
  `docker stop` until the runtime's SIGKILL at the end of its stop timeout. The attached CLI installs its
  handlers before anything else (control.attached.SignalRelay), so this module only has to reap.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

# The files container runtimes leave at the root of a container: Docker (and Moby-based engines), and
# podman/CRI-O/buildah (containers-common's `/run/.containerenv`, which holds the engine's name)
MARKER_FILES = ("/.dockerenv", "/run/.containerenv")
KUBERNETES_ENV = "KUBERNETES_SERVICE_HOST"  # set by the kubelet in every container of a pod


class ContainerFacts(NamedTuple):
    """What says this process runs in a container, and where it stands there."""

    markers: tuple[str, ...]  # the marker files found, and KUBERNETES_SERVICE_HOST when it is set
    pid: int  # our pid in our own pid namespace
    ppid: int  # 0: our parent is outside our pid namespace (`docker exec`, the runtime itself)

    @property
    def inside(self) -> bool:
        """In a container by its markers, or the init of a pid namespace whatever made it."""
        return bool(self.markers) or self.pid == 1

    @property
    def main_process(self) -> bool:
        """The container's main process: its PID 1, or the one child of the init the runtime put first
        (tini, catatonit, dumb-init, or an entrypoint script that did not `exec`). A command typed in a
        shell in the container (a notebook's `!jobwarden run`, `docker exec -it c bash`) is neither."""
        return self.pid == 1 or self.ppid == 1


def container_facts(env: Mapping[str, str], root: str = "/") -> ContainerFacts:
    """The markers under `root` (a test gives another), and our pid and parent's pid."""
    found = [m for m in MARKER_FILES if Path(root, m.lstrip("/")).exists()]
    if env.get(KUBERNETES_ENV):
        found.append(KUBERNETES_ENV)
    return ContainerFacts(tuple(found), os.getpid(), os.getppid())


def is_init() -> bool:
    """PID 1 of our pid namespace: the container's init, with its duties."""
    return os.getpid() == 1


def reap_orphans() -> list[tuple[int, int]]:
    """As the container's init: collect every child that has exited, orphans adopted from anywhere in the
    namespace included, without blocking. [(pid, raw wait status)]. A caller that must learn how one
    particular child ended holds a pidfd on it from before (see reap_through): the pidfd still names it,
    and says it has exited, after this took its status."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no children at all
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
        if pid == 0:
            break
        reaped.append((pid, status))
    return reaped


def reap_through(pidfd: int) -> None:
    """Wait for the exiting child that `pidfd` names, by the pidfd and not its pid: once reap_orphans has
    reaped it its pid may be an adopted orphan's, and waitpid(pid) would wait for that one instead."""
    with contextlib.suppress(ChildProcessError):  # reaped already (reap_orphans), or SIGCHLD ignored
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)

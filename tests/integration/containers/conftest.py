"""Real containers (tests/containerkit.py): rootful podman + runc on a Debian root file system made by
debootstrap, jobwarden from the checkout's wheel. One session of containers per test session, shared by every
`container` test; each test's containers are removed (their processes killed) when it ends.

A test mounts its own directory at /t (FIFOs for handshakes with the job, the termination log) and its own
JOBWARDEN_HOME at /jwhome, which the test reads on the host once the container has ended (while it runs,
through the store alone: `jobwarden ps` on the host would take the container's pids for the host's).

Without podman, runc or debootstrap (or root) the tests are skipped; in CI (CI=true) they fail: scripts/test
installs the packages where it runs as root."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containerkit import Container, Podman, missing_tools, session
from tests.support import unavailable

CHECKOUT = Path(__file__).resolve().parents[3]
HOME = "/jwhome"


@pytest.fixture(scope="session")
def podman_session() -> Iterator[Podman]:
    missing = missing_tools()
    if missing:
        unavailable(f"not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        unavailable("rootful podman needs root")
    scratch = Path(tempfile.mkdtemp(prefix="jw-ctr-"))
    try:
        with session(CHECKOUT, scratch, log=scratch / "debootstrap.log") as (podman, timings):
            print(f"\ncontainer session ready: {timings}")
            yield podman
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class Box:
    """One test's containers: its directory at /t, its home at /jwhome, `jobwarden run` as entrypoint."""

    def __init__(self, podman: Podman, tmp: Path) -> None:
        self.podman, self.tmp = podman, tmp
        self.home = tmp / "home"
        self.home.mkdir(mode=0o700)
        self.made: list[Container] = []

    def create(
        self,
        *command: str,
        options: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        init: str | None = None,
        memory: str | None = None,
        termination_log: Path | None = None,
    ) -> Container:
        volumes: dict[Path | str, str] = {self.tmp: "/t", self.home: HOME}
        if termination_log is not None:
            termination_log.touch(mode=0o666)  # what the kubelet mounts: an empty file
            volumes[termination_log] = "/dev/termination-log"
        container = self.podman.create(
            *command,
            options=options,
            volumes=volumes,
            env={"JOBWARDEN_HOME": HOME, "PYTHONUNBUFFERED": "1", **(env or {})},
            init=init,
            memory=memory,
        )
        self.made.append(container)
        return container

    def entrypoint(self, *args: str, **kwargs: object) -> Container:
        """`jobwarden run ARGS` as the container's command (what the README's ENTRYPOINT gives)."""
        return self.create("jobwarden", "run", *args, **kwargs)  # type: ignore[arg-type]

    def remove(self) -> None:
        for container in self.made:
            self.podman("rm", "--force", "--time", "0", container.name, timeout=60)


@pytest.fixture
def box(podman_session: Podman, tmp_path: Path) -> Iterator[Box]:
    tmp_path.chmod(0o755)
    made = Box(podman_session, tmp_path)
    try:
        yield made
    finally:
        made.remove()

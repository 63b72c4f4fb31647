"""Real containers for the tests and benchmarks: rootful podman + runc, a Debian root file system made by
debootstrap from the apt mirror (no image registry is reachable here), jobwarden from the checkout's wheel.

The recipe is the one of the containers research (its §6): a private containers.conf (nothing under /etc
changes) with the runtime runc, since crun 1.8 refuses this host's hybrid cgroup layout, and ulimits this
host can grant (root has no CAP_SYS_RESOURCE here: podman's default nofile=1048576 fails with EPERM).

- The base root file system (minbase + python3, python3-venv, procps) is built once per machine into
  ROOTFS (default /var/tmp/jobwarden-test-rootfs), under a lock, in a temporary directory renamed into
  place when complete, and stamped with the recipe: a half-built, foreign or older one is never used.
- Each test session makes its own virtual environment at /opt/jw from the checkout's wheel (and the py-spy
  binary of the test's own environment), bind-mounted read-only into every container: the base never
  changes, and `:O` gives each container a throwaway overlay on it.
- Containers are created and started from their bundle directory: Debian's conmon 2.1.6 writes its OOM
  marker into its working directory, where podman 4.3 never looks (then OOMKilled says false).

    python tests/containerkit.py            # build (or validate) the root file system, print its path
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOTFS = Path(os.environ.get("JOBWARDEN_TEST_ROOTFS", "/var/tmp/jobwarden-test-rootfs"))
SUITE = "bookworm"
PACKAGES = "python3,python3-venv,procps"
RECIPE = (
    f"debootstrap --variant=minbase --include={PACKAGES} {SUITE}; /usr/local/bin/jobwarden -> /opt/jw; v1"
)
STAMP = ".jobwarden-rootfs"
VENV = "/opt/jw"  # the session's environment, inside every container
TOOLS = (
    "podman",
    "runc",
    "debootstrap",
    "catatonit",
    "tini-static",
)  # the inits of --init: podman's, Docker's
PODMAN_TIMEOUT_S = 120.0


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]


def apt_mirror() -> str:
    """The Debian mirror apt itself uses (deb822 sources first, then sources.list)."""
    sources = [*sorted(Path("/etc/apt/sources.list.d").glob("*.sources")), Path("/etc/apt/sources.list")]
    for path in sources:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                found = re.match(r"\s*(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", line)
                if found and "security" not in found.group(1):
                    return found.group(1)
    return "http://deb.debian.org/debian"


def rootfs_valid(root: Path) -> bool:
    """Complete (the stamp is written last, before the rename), this recipe's, and root's own."""
    try:
        stamp = (root / STAMP).read_text()
        owner = root.stat().st_uid
    except OSError:
        return False
    return stamp == RECIPE and owner == 0 and (root / "usr/bin/python3").exists()


def ensure_rootfs(root: Path = ROOTFS, log: Path | None = None) -> tuple[Path, float]:
    """The validated base root file system, built first if needed; (its path, seconds spent building)."""
    if rootfs_valid(root):
        return root, 0.0
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it: wait, then use theirs
        if rootfs_valid(root):
            return root, 0.0
        began = time.monotonic()
        build = Path(tempfile.mkdtemp(prefix=f"{root.name}.build-", dir=root.parent))
        try:
            _debootstrap(build, log)
            local_bin = build / "usr/local/bin"
            local_bin.mkdir(parents=True, exist_ok=True)
            for tool in ("jobwarden", "py-spy"):
                (local_bin / tool).symlink_to(f"{VENV}/bin/{tool}")
            (build / STAMP).write_text(RECIPE)
            if root.exists() or root.is_symlink():  # an older recipe's, or a broken one: replaced
                stale = Path(tempfile.mkdtemp(prefix=f"{root.name}.stale-", dir=root.parent))
                root.rename(stale / "rootfs")
                shutil.rmtree(stale, ignore_errors=True)
            build.rename(root)
        finally:
            if build.exists():
                shutil.rmtree(build, ignore_errors=True)
        return root, time.monotonic() - began


def _debootstrap(target: Path, log: Path | None) -> None:
    argv = ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(target), apt_mirror()]
    with open(log or os.devnull, "a") as out:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=900
        )
    if done.returncode != 0:
        raise RuntimeError(f"debootstrap failed ({done.returncode}); see {log}")


def write_containers_conf(path: Path) -> Path:
    """runc, and the ulimits this host allows (podman itself runs with nproc <= 32768)."""
    import resource

    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 32768 if nproc == resource.RLIM_INFINITY or nproc > 32768 else nproc
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    return path


def build_wheel(checkout: Path, into: Path) -> Path:
    """The checkout's own wheel (jobwarden only: py-spy comes as the binary the tests already use), built
    from a copy of what goes into it: a build in the checkout itself works in its build/ directory, which
    another build at the same time (a second test worker, a developer's) empties under it."""
    source = into.parent / "source"
    shutil.rmtree(source, ignore_errors=True)
    leave_out = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(checkout / "src", source / "src", ignore=leave_out)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (checkout / name).exists():
            shutil.copy2(checkout / name, source / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(into),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    wheels = sorted(into.glob("jobwarden-*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(f"pip wheel of {checkout} failed: {done.stderr.strip()[-2000:]}")
    return wheels[-1]


class Podman:
    """podman with the session's configuration, root file system and environment; every container it made
    is removed by `remove_all` (its processes killed: a test never leaks one)."""

    def __init__(self, conf: Path, rootfs: Path, venv: Path | None, workdir: Path) -> None:
        self.conf, self.rootfs, self.venv, self.workdir = conf, rootfs, venv, workdir
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.prefix = f"jwt-{uuid.uuid4().hex[:8]}"
        self.made: list[str] = []

    def __call__(
        self, *args: str, timeout: float = PODMAN_TIMEOUT_S, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args],
            env=self.env,
            text=True,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=cwd or self.workdir,
        )

    def check(self, *args: str, timeout: float = PODMAN_TIMEOUT_S) -> str:
        done = self(*args, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} -> {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def create(
        self,
        *command: str,
        options: Sequence[str] = (),
        volumes: Mapping[Path | str, str] | None = None,
        env: Mapping[str, str] | None = None,
        init: str | None = None,
        memory: str | None = None,
    ) -> Container:
        """A container on a fresh overlay of the root file system, no network, the session's /opt/jw. `init`:
        "catatonit" (podman's --init) or the path of another init binary (tini, as `docker run --init`)."""
        name = f"{self.prefix}-{len(self.made)}"
        argv = ["create", "--name", name, "--network", "none"]
        if self.venv is not None:
            argv += ["-v", f"{self.venv}:{VENV}:ro"]
        for host, inside in (volumes or {}).items():
            argv += ["-v", f"{host}:{inside}"]
        for key, value in (env or {}).items():
            argv += ["-e", f"{key}={value}"]
        if init is not None:
            argv += ["--init"] if init == "catatonit" else ["--init", "--init-path", init]
        argv += ["--memory", memory] if memory else []
        self.made.append(name)
        self.check(*argv, *options, "--rootfs", f"{self.rootfs}:O", *command)
        return Container(self, name)

    def remove_all(self) -> None:
        for name in self.made:
            self("rm", "--force", "--time", "0", name, timeout=60)
        self.made.clear()


class Container:
    def __init__(self, podman: Podman, name: str) -> None:
        self.podman, self.name = podman, name

    def bundle(self) -> Path:
        return Path(self.inspect("{{.StaticDir}}"))

    def run(self, timeout: float = PODMAN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Start it attached (its stdout and stderr captured) and wait for its end."""
        return self.podman("start", "--attach", self.name, timeout=timeout, cwd=self.bundle())

    def start(self) -> None:
        """Start it in the background (`podman start`): for a container the test stops or probes."""
        done = self.podman("start", self.name, cwd=self.bundle())
        if done.returncode != 0:
            raise RuntimeError(f"podman start {self.name}: {done.stderr.strip()}")

    def stop(self, timeout_s: int) -> float:
        """`podman stop -t N` (SIGTERM to PID 1, SIGKILL N seconds later, as the kubelet does); how long it
        took."""
        began = time.monotonic()
        self.podman.check("stop", "--time", str(timeout_s), self.name, timeout=timeout_s + 60)
        return time.monotonic() - began

    def wait(self, timeout: float = PODMAN_TIMEOUT_S) -> int:
        return int(self.podman.check("wait", self.name, timeout=timeout).strip())

    def exec(self, *command: str, timeout: float = PODMAN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return self.podman("exec", self.name, *command, timeout=timeout)

    def inspect(self, template: str) -> str:
        return self.podman.check("inspect", self.name, "--format", template).strip()

    def exit_code(self) -> int:
        return int(self.inspect("{{.State.ExitCode}}"))

    def logs(self) -> subprocess.CompletedProcess[str]:
        return self.podman("logs", self.name)


@contextlib.contextmanager
def session(
    checkout: Path, scratch: Path, log: Path | None = None
) -> Iterator[tuple[Podman, dict[str, float]]]:
    """Everything a test session needs: the base root file system, the configuration, the session's
    /opt/jw; yields (podman, the seconds each setup step took)."""
    timings: dict[str, float] = {}
    rootfs, timings["rootfs_build_s"] = ensure_rootfs(log=log)
    conf = write_containers_conf(scratch / "containers.conf")
    wheels = scratch / "wheels"
    wheels.mkdir()
    began = time.monotonic()
    build_wheel(checkout, wheels)
    timings["wheel_s"] = time.monotonic() - began
    venv = scratch / "opt-jw"
    venv.mkdir()
    podman = Podman(conf, rootfs, None, scratch)
    began = time.monotonic()
    try:
        _install(podman, wheels, venv)
        timings["venv_s"] = time.monotonic() - began
        podman.venv = venv
        yield podman, timings
    finally:
        podman.remove_all()


def _install(podman: Podman, wheels: Path, venv: Path) -> None:
    """python3 -m venv /opt/jw in a container (the root file system's own Python), the wheel into it, and
    the py-spy binary of the test's environment beside it (where jobwarden looks first)."""
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise RuntimeError("py-spy is not installed beside the test's Python (scripts/setup --dev)")
    script = (
        f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --no-index --no-deps /wheels/*.whl "
        f"&& cp /py-spy {VENV}/bin/py-spy && {VENV}/bin/jobwarden --version"
    )
    container = podman.create(
        "sh", "-c", script, volumes={wheels: "/wheels:ro", venv: VENV, py_spy: "/py-spy:ro"}
    )
    done = container.run(timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"installing jobwarden into the container failed: {done.stdout}{done.stderr}")


if __name__ == "__main__":
    path, took = ensure_rootfs(log=Path(tempfile.gettempdir(), "jobwarden-rootfs.log"))
    print(f"{path} ({f'built in {took:.0f}s' if took else 'valid, cached'})")

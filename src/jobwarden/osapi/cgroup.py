"""A cgroup for one job, when a writable one exists: v2 (a delegated or root-owned subtree) or v1 memory.

Membership in a cgroup cannot be escaped by setsid or double forks, so its `cgroup.procs` is the most
complete list of the job's processes. Without one (most containers, unprivileged users on cgroup v1)
jobwarden contains the tree by subreaper + scanning, and says so.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    point: Path
    root: str
    fstype: str
    options: frozenset[str]


def _mounts(mountinfo: str) -> list[Mount]:
    mounts = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mounts.append(Mount(Path(fields[4]), fields[3], rfields[0], frozenset(rfields[2].split(","))))
    return mounts


def _own_cgroups(cgroup_text: str) -> dict[str, str]:
    """'0::/a' -> {'': '/a'}, '4:memory:/b' -> {'memory': '/b'}."""
    own = {}
    for line in cgroup_text.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _under(mount: Mount, cgroup_path: str) -> Path:
    rel = cgroup_path[len(mount.root) :] if cgroup_path.startswith(mount.root) else cgroup_path
    return mount.point / rel.lstrip("/")


@dataclass(frozen=True)
class JobCgroup:
    path: Path
    version: int

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except OSError:
            return []

    def kill_all(self) -> bool:
        """cgroup v2 `cgroup.kill` (Linux >= 5.14): SIGKILL every member atomically, forks included."""
        kill = self.path / "cgroup.kill"
        if self.version != 2 or not kill.exists():
            return False
        kill.write_text("1")
        return True

    def remove(self) -> bool:
        with contextlib.suppress(OSError):
            self.path.rmdir()
            return True
        return False


def _has_memory(version: int, parent: Path) -> bool:
    if version == 1:
        return True
    try:
        return "memory" in (parent / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def create_job_cgroup(name: str, proc_root: str = "/proc") -> JobCgroup | None:
    """Make a child cgroup of our own, v2 first, then v1 memory; None when neither is writable."""
    try:
        mounts = _mounts(Path(proc_root, "self/mountinfo").read_text())
        own = _own_cgroups(Path(proc_root, "self/cgroup").read_text())
    except OSError:
        return None
    candidates: list[tuple[int, Path]] = []
    for mount in mounts:
        if mount.fstype == "cgroup2" and "" in own:
            candidates.append((2, _under(mount, own[""])))
        elif mount.fstype == "cgroup" and "memory" in mount.options and "memory" in own:
            candidates.append((1, _under(mount, own["memory"])))
    # Prefer a cgroup that can limit memory (needed for --mem-limit and OOM counters), then v2.
    for version, parent in sorted(candidates, key=lambda c: (not _has_memory(*c), -c[0])):
        path = parent / name
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            pass
        except OSError:
            continue
        if os.access(path / "cgroup.procs", os.W_OK):
            return JobCgroup(path, 2 if version == 2 else 1)
        with contextlib.suppress(OSError):
            path.rmdir()
    return None


def cgroup_path(containment: str | None) -> str | None:
    """The cgroup directory in a run's containment note ("cgroup-v1 /sys/fs/cgroup/...")."""
    if containment and containment.startswith("cgroup-"):
        return containment.split(" ", 1)[1]
    return None


def find_job_cgroup(path: str | None) -> JobCgroup | None:
    """Re-open a job's cgroup recorded in the store (for adopt)."""
    if not path or not Path(path).is_dir():
        return None
    version = 2 if Path(path, "cgroup.kill").exists() or Path(path, "cgroup.events").exists() else 1
    return JobCgroup(Path(path), version)

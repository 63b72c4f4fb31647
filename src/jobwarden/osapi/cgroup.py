"""A cgroup for one job, when a writable one exists: v2 (a delegated or root-owned subtree) or v1 memory.

Membership in a cgroup cannot be escaped by setsid or double forks, so its `cgroup.procs` is the most
complete list of the job's processes. Without one (most containers, unprivileged users on cgroup v1)
jobwarden contains the tree by subreaper + scanning, and says so.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import NamedTuple

from jobwarden.errors import OsApiError

# cgroup v1 reports "no limit" as the largest page-aligned signed 64-bit value (PAGE_COUNTER_MAX pages)
_V1_UNLIMITED = 1 << 62


class Mount(NamedTuple):
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


class CgroupMemory(NamedTuple):
    """Memory counters of one cgroup. None where this kernel or hierarchy does not keep the counter."""

    current_bytes: int | None
    peak_bytes: int | None  # v1 memory.max_usage_in_bytes; v2 memory.peak (Linux >= 5.19)
    limit_bytes: int | None  # None: no limit
    oom_kills: int | None  # processes killed by the OOM killer (v1 needs Linux >= 4.13)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    if text is None or text.strip() == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    """'oom_kill 3' out of a flat keyed file (memory.events, memory.oom_control)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


class JobCgroup(NamedTuple):
    path: Path
    version: int
    fresh: bool = False  # made by us just now: its counters (OOM kills) start at zero

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

    def move_out(self, pid: int) -> bool:
        """Move a process to the parent cgroup (where the shim is), out of the job's limits and kill:
        --keep-running. False when the kernel refuses it."""
        try:
            (self.path.parent / "cgroup.procs").write_text(str(pid))
        except OSError:
            return False
        return True

    def remove(self) -> bool:
        with contextlib.suppress(OSError):
            self.path.rmdir()
            return True
        return False

    # --- memory -------------------------------------------------------------------------------------

    @property
    def has_memory_controller(self) -> bool:
        """Can this cgroup limit memory? On v2 the parent must list `memory` in cgroup.subtree_control."""
        return (self.path / ("memory.limit_in_bytes" if self.version == 1 else "memory.max")).exists()

    def set_memory_limit(self, limit_bytes: int) -> None:
        """Cap the memory of every process in the cgroup; past it the kernel reclaims, then OOM-kills.

        Swap is capped too (v1 memory+swap = the limit, v2 memory.swap.max = 0): otherwise a job over its
        limit pages out and crawls instead of failing, and the limit means nothing."""
        if limit_bytes <= 0:
            raise OsApiError(f"bad memory limit {limit_bytes}", "give a positive size, e.g. 8G")
        if not self.has_memory_controller:
            raise OsApiError(
                f"cannot limit memory: cgroup {self.path} has no memory controller",
                "run where a memory cgroup is writable (root on cgroup v1, a delegated v2 subtree), "
                "or drop --mem-limit",
            )
        if self.version == 1:
            self._set_v1_limit(limit_bytes)
        else:
            self._write("memory.max", limit_bytes)
            if (self.path / "memory.swap.max").exists():  # absent without swap accounting: nothing to cap
                self._write("memory.swap.max", 0)

    def _set_v1_limit(self, limit_bytes: int) -> None:
        if not (self.path / "memory.memsw.limit_in_bytes").exists():  # swap accounting off
            self._write("memory.limit_in_bytes", limit_bytes)
            return
        # The kernel keeps memsw.limit >= limit at every moment (EINVAL otherwise): lowering sets the memory
        # limit first, raising sets memory+swap first. Try one order, then the other.
        try:
            self._write("memory.limit_in_bytes", limit_bytes)
            self._write("memory.memsw.limit_in_bytes", limit_bytes)
        except OsApiError:
            self._write("memory.memsw.limit_in_bytes", limit_bytes)
            self._write("memory.limit_in_bytes", limit_bytes)

    def _write(self, name: str, value: int) -> None:
        try:
            (self.path / name).write_text(str(value))
        except OSError as err:
            raise OsApiError(
                f"cannot set {name} of {self.path} to {value}: {err.strerror or err}",
                "a limit below what the job already uses cannot be set (EBUSY); otherwise check that "
                "jobwarden may write to this cgroup",
            ) from err

    def oom_kills(self) -> int | None:
        """The OOM kill counter alone: one small read, cheap enough for every tick."""
        if self.version == 1:
            return _keyed(_read(self.path / "memory.oom_control"), "oom_kill")
        return _keyed(_read(self.path / "memory.events"), "oom_kill")

    def memory_stats(self) -> CgroupMemory | None:
        """Usage, peak, limit and OOM kills; None when the cgroup has no memory controller (or is gone)."""
        if not self.has_memory_controller:
            return None
        if self.version == 1:
            limit = _read_int(self.path / "memory.limit_in_bytes")
            return CgroupMemory(
                current_bytes=_read_int(self.path / "memory.usage_in_bytes"),
                peak_bytes=_read_int(self.path / "memory.max_usage_in_bytes"),
                limit_bytes=None if limit is None or limit >= _V1_UNLIMITED else limit,
                oom_kills=self.oom_kills(),
            )
        return CgroupMemory(
            current_bytes=_read_int(self.path / "memory.current"),
            peak_bytes=_read_int(self.path / "memory.peak"),
            limit_bytes=_read_int(self.path / "memory.max"),
            oom_kills=self.oom_kills(),
        )

    def refaults(self) -> int | None:
        """Pages read back in after memory pressure evicted them (memory.stat workingset_refault_*: file
        and anon, hierarchical); None without a memory controller or the counter (Linux < 5.9)."""
        if not self.has_memory_controller:
            return None
        text = _read(self.path / "memory.stat")
        prefix = "total_" if self.version == 1 else ""
        found = [_keyed(text, f"{prefix}workingset_refault_{kind}") for kind in ("file", "anon")]
        if all(n is None for n in found):
            return _keyed(text, f"{prefix}workingset_refault")
        return sum(n or 0 for n in found)

    def hierarchy_path(self, proc_root: str = "/proc") -> str | None:
        """The cgroup's path inside its hierarchy ('/a/jobwarden-12'), as the kernel log prints it in
        'oom-kill:...,task_memcg=/a/jobwarden-12'. None when no mount holds it."""
        try:
            mounts = _mounts(Path(proc_root, "self/mountinfo").read_text())
        except OSError:
            return None
        holders = [m for m in mounts if m.fstype.startswith("cgroup") and self.path.is_relative_to(m.point)]
        if not holders:
            return None
        best = max(holders, key=lambda m: len(m.point.parts))  # /sys/fs/cgroup/memory, not /sys/fs/cgroup
        rel = self.path.relative_to(best.point).as_posix()
        return "/" + "/".join(p for p in (best.root.strip("/"), rel if rel != "." else "") if p)


def _has_memory(version: int, parent: Path) -> bool:
    if version == 1:
        return True
    try:
        return "memory" in (parent / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def _job_cgroup_parents(proc_root: str) -> list[tuple[int, Path]]:
    """Where a job's cgroup can be made: under our own, in the v2 hierarchy and the v1 memory one."""
    try:
        mounts = _mounts(Path(proc_root, "self/mountinfo").read_text())
        own = _own_cgroups(Path(proc_root, "self/cgroup").read_text())
    except OSError:
        return []
    candidates: list[tuple[int, Path]] = []
    for mount in mounts:
        if mount.fstype == "cgroup2" and "" in own:
            candidates.append((2, _under(mount, own[""])))
        elif mount.fstype == "cgroup" and "memory" in mount.options and "memory" in own:
            candidates.append((1, _under(mount, own["memory"])))
    return candidates


def create_job_cgroup(name: str, proc_root: str = "/proc") -> JobCgroup | None:
    """Make a child cgroup of our own, v2 first, then v1 memory; None when neither is writable."""
    candidates = _job_cgroup_parents(proc_root)
    # Prefer a cgroup that can limit memory (needed for --mem-limit and OOM counters), then v2.
    for version, parent in sorted(candidates, key=lambda c: (not _has_memory(*c), -c[0])):
        path = parent / name
        fresh = True
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            fresh = False  # a dead shim's of the same pid, still populated: counts of its own
        except OSError:
            continue
        if os.access(path / "cgroup.procs", os.W_OK):
            return JobCgroup(path, 2 if version == 2 else 1, fresh)
        with contextlib.suppress(OSError):
            path.rmdir()
    return None


def remove_dead_shims_cgroups(proc_root: str = "/proc") -> list[Path]:
    """Remove the empty cgroups that shims killed before their end (SIGKILL, the OOM killer) left behind:
    `jobwarden-<shim pid>` beside where ours would be. Kept: one whose shim lives (its pid runs a
    jobwarden program; a reused pid keeps it until the next sweep, no harm), and a populated one (rmdir
    of a cgroup with a process, or a child cgroup, fails with EBUSY: the kernel checks, atomically).
    Returns those removed."""
    removed = []
    for _, parent in _job_cgroup_parents(proc_root):
        try:
            names = [entry.name for entry in os.scandir(parent) if entry.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for name in names:
            prefix, _, pid = name.partition("-")
            if prefix != "jobwarden" or not pid.isdigit() or _runs_jobwarden(proc_root, int(pid)):
                continue
            with contextlib.suppress(OSError):
                (parent / name).rmdir()
                removed.append(parent / name)
    return removed


def _runs_jobwarden(proc_root: str, pid: int) -> bool:
    try:
        return b"jobwarden" in Path(proc_root, str(pid), "cmdline").read_bytes()
    except OSError:
        return False


def cgroup_path(containment: str | None) -> str | None:
    """The cgroup directory in a run's containment note ("cgroup-v1 /sys/fs/cgroup/...")."""
    if containment and containment.startswith("cgroup-"):
        return containment.split(" ", 1)[1]
    return None


def enclosing_cgroup(proc_root: str = "/proc") -> JobCgroup | None:
    """The memory cgroup jobwarden itself runs in (a container's, a Slurm step's): its limit can kill the
    job with no jobwarden cgroup at all, and its OOM counter is the evidence. v2 first, then v1 memory;
    None when neither has an OOM counter to read (e.g. the v2 root cgroup has no memory.events)."""
    try:
        mounts = _mounts(Path(proc_root, "self/mountinfo").read_text())
        own = _own_cgroups(Path(proc_root, "self/cgroup").read_text())
    except OSError:
        return None
    found: list[JobCgroup] = []
    for mount in mounts:
        if mount.fstype == "cgroup2" and "" in own:
            found.append(JobCgroup(_under(mount, own[""]), 2))
        elif mount.fstype == "cgroup" and "memory" in mount.options and "memory" in own:
            found.append(JobCgroup(_under(mount, own["memory"]), 1))
    for cgroup in sorted(found, key=lambda c: -c.version):
        if cgroup.oom_kills() is not None:
            return cgroup
    return None


def find_job_cgroup(path: str | None) -> JobCgroup | None:
    """Re-open a job's cgroup recorded in the store (for adopt)."""
    if not path or not Path(path).is_dir():
        return None
    version = 2 if Path(path, "cgroup.kill").exists() or Path(path, "cgroup.events").exists() else 1
    return JobCgroup(Path(path), version)

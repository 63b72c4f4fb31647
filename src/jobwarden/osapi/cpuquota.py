"""The CPU side of a job's cgroups, read for the speed rules: its quota, how often the quota throttled it,
and the cgroup's pressure (PSI).

The job's CPU cgroup is not jobwarden's memory cgroup: it is wherever the job already runs (a container's,
a Slurm step's, one a user made), found from /proc/PID/cgroup. A quota may be set on any ancestor, so the
whole chain up to the mount is looked at, and the tightest quota is the one that counts. Counters, after
the kernel's documents: v1 `cpu.stat` `nr_periods nr_throttled throttled_time` (ns,
Documentation/scheduler/sched-bwc.rst), v2 `cpu.stat` `nr_periods nr_throttled throttled_usec` (present
only with the cpu controller enabled, Documentation/admin-guide/cgroup-v2.rst). Measured on this kind of
machine (research/slowness.md 5.2): a 0.25-CPU v1 quota gives 90 of 91 periods throttled.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from jobwarden.osapi.cgroup import Mount, _mounts, _own_cgroups, _under
from jobwarden.osapi.procfs import Pressure, parse_pressure


class CpuStat(NamedTuple):
    nr_periods: int
    nr_throttled: int
    throttled_ns: int


def parse_cpu_stat(text: str) -> CpuStat | None:
    """A cpu.stat file of either version; None when it holds no throttling counters (v2 without the cpu
    controller keeps only usage)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        value = value.strip()
        if value.isascii() and value.isdigit():
            fields[name] = int(value)
    if "nr_periods" not in fields or "nr_throttled" not in fields:
        return None
    if "throttled_time" in fields:  # v1: nanoseconds
        throttled = fields["throttled_time"]
    elif "throttled_usec" in fields:
        throttled = fields["throttled_usec"] * 1000
    else:
        return None
    return CpuStat(fields["nr_periods"], fields["nr_throttled"], throttled)


def parse_quota(version: int, quota_text: str | None, period_text: str | None = None) -> float | None:
    """CPUs a quota allows (0.25 for 25000/100000); None for no quota. v2 `cpu.max` is "QUOTA PERIOD" or
    "max PERIOD"; v1 has `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us`."""
    try:
        if version == 2:
            quota, _, period = (quota_text or "").strip().partition(" ")
            if quota == "max" or not quota:
                return None
            quota_us, period_us = int(quota), int(period or "100000")
        else:
            quota_us = int((quota_text or "").strip())
            period_us = int((period_text or "").strip())
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(4096)
    except OSError:
        return None


class CpuCgroup(NamedTuple):
    """The job's CPU cgroup: its quota (the tightest of the chain) and where to read what it did."""

    version: int
    path: Path  # the job's own cgroup in the cpu hierarchy
    limiter: Path | None  # the cgroup of the chain whose quota is the tightest; None: no quota
    quota_cpus: float | None
    pressure_dir: Path | None  # a v2 cgroup directory with *.pressure files (a hybrid's unified one too)

    def cpu_stat(self) -> CpuStat | None:
        if self.limiter is None:
            return None
        text = _read(self.limiter / "cpu.stat")
        return parse_cpu_stat(text) if text is not None else None

    def pressure(self, resource: str) -> Pressure | None:
        if self.pressure_dir is None:
            return None
        text = _read(self.pressure_dir / f"{resource}.pressure")
        try:
            return parse_pressure(text) if text else None
        except ValueError:
            return None


def _chain(mount: Mount, path: Path) -> list[Path]:
    """`path` and its ancestors up to the mount point, innermost first."""
    chain = [path]
    while chain[-1] != mount.point and mount.point in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _tightest(version: int, chain: list[Path]) -> tuple[Path | None, float | None]:
    best: tuple[Path | None, float | None] = (None, None)
    for level in chain:
        if version == 2:
            cpus = parse_quota(2, _read(level / "cpu.max"))
        else:
            cpus = parse_quota(1, _read(level / "cpu.cfs_quota_us"), _read(level / "cpu.cfs_period_us"))
        if cpus is not None and (best[1] is None or cpus < best[1]):
            best = (level, cpus)
    return best


def cpu_cgroup_of(pid: int, proc_root: str = "/proc") -> CpuCgroup | None:
    """The CPU cgroup `pid` runs in, as this process's mounts show it; None when no cpu hierarchy is
    mounted or the process is gone."""
    try:
        mounts = _mounts(Path(proc_root, "self/mountinfo").read_text())
        own = _own_cgroups(Path(proc_root, str(pid), "cgroup").read_text())
    except (OSError, ValueError):
        return None
    v1 = next((m for m in mounts if m.fstype == "cgroup" and "cpu" in m.options and "cpu" in own), None)
    v2 = next((m for m in mounts if m.fstype == "cgroup2" and "" in own), None)
    pressure_dir = _under(v2, own[""]) if v2 is not None else None
    # the root cgroup's pressure is the machine's (/proc/pressure): only a cgroup of its own is the job's
    if pressure_dir is not None and (v2 is None or pressure_dir == v2.point):
        pressure_dir = None
    if pressure_dir is not None and not (pressure_dir / "cpu.pressure").exists():
        pressure_dir = None
    if v1 is not None:
        version, mount, path = 1, v1, _under(v1, own["cpu"])
    elif v2 is not None:
        version, mount, path = 2, v2, _under(v2, own[""])
    else:
        return None
    limiter, quota = _tightest(version, _chain(mount, path))
    return CpuCgroup(version, path, limiter, quota, pressure_dir)

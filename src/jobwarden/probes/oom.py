"""Evidence that the kernel OOM killer ended a process of the job, gathered while the run lasts.

Sources, strongest first (docs/rules.md, "OOM evidence"):
  1. the job's own cgroup: its oom_kill counter moves only for processes inside it;
  2. the enclosing cgroup (the container or Slurm step jobwarden runs in): its limit kills the job even
     when jobwarden has no cgroup of its own;
  3. /proc/vmstat oom_kill: host-wide, readable everywhere, but only a correlation;
  4. the kernel log: the only source that names the victims (pid, command, memory cgroup).
Each poll reads one small file when the job's cgroup counts kills (~20 µs), else two: the enclosing
cgroup's counter and /proc/vmstat (~60 µs). The kernel log is read only once a counter moved, and until
it has named as many victims as were counted: the kernel bumps the counters just before it prints
"Killed process" (mm/oom_kill.c __oom_kill_process()), so the lines may come a poll later.

On cgroup v1 a cgroup's oom_kill counts only its own processes; on v2 memory.events counts the whole
subtree (memcg_memory_event() walks up unless memory_localevents). Either way the job's own counter is
the certain one, and a kill elsewhere on the host never becomes the job's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jobwarden.observations import OomEvidence
from jobwarden.osapi.cgroup import JobCgroup, enclosing_cgroup
from jobwarden.probes.kmsg import KernelLog, OomLine, oom_lines

# polls that read the kernel log after a counter moved without its lines showing up (rate limits,
# records overwritten, a victim in another pid namespace): then stop looking until the next move
_LOG_PATIENCE = 5


@dataclass(frozen=True)
class OomBaseline:
    """The counters at the start of a run, and where the kernel log stood: saved, they let a new shim
    (adopt) count only this run's kills."""

    cgroup_kills: int | None
    enclosing_kills: int | None
    host_kills: int | None
    kmsg_seq: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "cgroup_kills": self.cgroup_kills,
            "enclosing_kills": self.enclosing_kills,
            "host_kills": self.host_kills,
            "kmsg_seq": self.kmsg_seq,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OomBaseline:
        return cls(d.get("cgroup_kills"), d.get("enclosing_kills"), d.get("host_kills"), d.get("kmsg_seq"))


def read_vmstat_oom_kills(proc_root: str | Path = "/proc") -> int | None:
    """/proc/vmstat oom_kill (Linux >= 4.13): every OOM kill on the host, cgroup ones included."""
    try:
        with open(Path(proc_root, "vmstat"), "rb") as fh:
            text = b"\n" + fh.read()
    except OSError:
        return None
    at = text.find(b"\noom_kill ")
    if at < 0:
        return None
    return int(text[at + 10 : text.index(b"\n", at + 1)])


def _delta(now: int | None, then: int | None) -> int:
    return now - then if now is not None and then is not None and now > then else 0


@dataclass(frozen=True)
class OomCounters:
    """The kill counters before the job started: the job's cgroup (one jobwarden did not make), the
    enclosing one's, the host's. A container's job OOM-killed in its first second was killed before a
    baseline taken after `run` answered, on a loaded machine: it must count (seen in CI)."""

    cgroup_kills: int | None
    enclosing_kills: int | None
    host_kills: int | None


def counters_before_start(cgroup: JobCgroup | None, proc_root: str | Path = "/proc") -> OomCounters:
    """Three small reads (no kernel log: opening it waits until after `run` answered)."""
    enclosing = enclosing_cgroup(str(proc_root))
    return OomCounters(
        cgroup.oom_kills() if cgroup else None,
        enclosing.oom_kills() if enclosing else None,
        read_vmstat_oom_kills(Path(proc_root)),
    )


class OomWatch:
    """Call `baseline()` (or `restore()`) when the run starts, then `poll()` once a tick."""

    def __init__(
        self,
        cgroup: JobCgroup | None,
        proc_root: str | Path = "/proc",
        *,
        enclosing: JobCgroup | Literal["auto"] | None = "auto",
        kmsg_path: str | Path = "/dev/kmsg",
    ) -> None:
        self.cgroup = cgroup
        self.proc_root = Path(proc_root)
        self.enclosing = enclosing_cgroup(str(proc_root)) if enclosing == "auto" else enclosing
        self.kernel_log = KernelLog(kmsg_path)
        self._memcg = cgroup.hierarchy_path(str(proc_root)) if cgroup else None
        self._base = OomBaseline(None, None, None, None)
        self._lines: list[OomLine] = []  # every OOM line since the baseline, ours or not
        self._seen = (0, 0, 0)  # counter deltas at the last poll
        self._patience = 0
        self._last: tuple[tuple[int, int], OomEvidence] | None = None

    @property
    def certain(self) -> bool:
        """The job has a cgroup that counts OOM kills: its counter alone decides, and no kill elsewhere
        (container, host) is mistaken for the job's."""
        return self.cgroup is not None and self._base.cgroup_kills is not None

    def baseline(self, fresh_cgroup: bool = False, before: OomCounters | None = None) -> OomBaseline:
        """Counters and kernel log from now on; the job's own cgroup from zero when it was made for this
        run (`fresh_cgroup`), else the counters read `before` the job started: a kill before this call
        is the job's, and must count."""
        self.kernel_log.open_at_end()
        seq = self.kernel_log.last_seq
        counted = self.cgroup.oom_kills() if self.cgroup else None
        if counted is not None and fresh_cgroup:
            counted = 0
        elif counted is not None and before is not None and before.cgroup_kills is not None:
            counted = before.cgroup_kills
        if counted is not None:
            self._base = OomBaseline(counted, None, None, seq)
        elif before is not None:
            self._base = OomBaseline(None, before.enclosing_kills, before.host_kills, seq)
        else:
            enclosing = self.enclosing.oom_kills() if self.enclosing else None
            self._base = OomBaseline(None, enclosing, read_vmstat_oom_kills(self.proc_root), seq)
        return self._base

    def restore(self, saved: OomBaseline) -> None:
        """Continue a run watched by an earlier shim: count from its baseline, read the log after it."""
        self._base = saved
        self.kernel_log.open_after(saved.kmsg_seq)
        self._patience = _LOG_PATIENCE  # kills may have happened while nobody watched

    def _counters(self) -> tuple[int | None, int | None, int | None]:
        """Two small reads at most: the job's counter when it has one (/proc/vmstat alone costs ~60 µs,
        the kernel sums every vm counter to print it), else the enclosing cgroup's and the host's."""
        if self.certain:
            return (self.cgroup.oom_kills() if self.cgroup else None, None, None)
        return (
            None,
            self.enclosing.oom_kills() if self.enclosing else None,
            read_vmstat_oom_kills(self.proc_root),
        )

    def poll(self, job_pids: Collection[int] | None = None) -> OomEvidence | None:
        """OOM kills of the job since the baseline, or None. `job_pids`: every pid the job had (dead ones
        included) to tell its victims from other processes' in the kernel log; None takes them all."""
        now = self._counters()
        base = (self._base.cgroup_kills, self._base.enclosing_kills, self._base.host_kills)
        deltas = (_delta(now[0], base[0]), _delta(now[1], base[1]), _delta(now[2], base[2]))
        if deltas != self._seen:
            self._seen, self._patience = deltas, _LOG_PATIENCE
        if self._patience > 0 and self.kernel_log.fd is not None:
            self._lines.extend(oom_lines(self.kernel_log.read_new()))
            named = self._ours(job_pids) if self.certain else self._lines
            self._patience = 0 if len({line.pid for line in named}) >= max(deltas) else self._patience - 1
        return self._judge(deltas, job_pids)

    def _judge(self, deltas: tuple[int, int, int], job_pids: Collection[int] | None) -> OomEvidence | None:
        job_kills, enclosing_kills, host_kills = deltas
        if self.certain:
            return self._evidence(self.cgroup, job_kills, self._ours(job_pids)) if job_kills else None
        # Less certain sources: a kill in the container or on the host need not be the job's. Where the
        # kernel log can tell, believe it; where it cannot, report the correlation.
        if enclosing_kills and self.enclosing:
            return self._unsure(self.enclosing, enclosing_kills, job_pids)
        if host_kills:
            return self._unsure(None, host_kills, job_pids)
        return None

    def _unsure(
        self, cgroup: JobCgroup | None, kills: int, job_pids: Collection[int] | None
    ) -> OomEvidence | None:
        if self.kernel_log.fd is None:
            return self._evidence(cgroup, kills, [])
        ours = self._ours(job_pids)
        return self._evidence(cgroup, len({line.pid for line in ours}), ours) if ours else None

    def _ours(self, job_pids: Collection[int] | None) -> list[OomLine]:
        """The kernel lines about the job's victims: a pid of the job, or a victim in the job's cgroup."""
        pids = self._victims(job_pids)
        if self._memcg:
            pids |= {line.pid for line in self._lines if line.memcg and _same_memcg(line.memcg, self._memcg)}
        return [line for line in self._lines if line.pid in pids]

    def _victims(self, job_pids: Collection[int] | None) -> set[int]:
        return {line.pid for line in self._lines if job_pids is None or line.pid in job_pids}

    def _evidence(self, cgroup: JobCgroup | None, kills: int, lines: list[OomLine]) -> OomEvidence:
        key = (kills, len(lines))
        if self._last is not None and self._last[0] == key:
            return self._last[1]  # nothing new: spare the four reads of memory_stats()
        limit, peak = self._limit_and_peak(cgroup)
        evidence = OomEvidence(
            mechanism=f"cgroup-v{cgroup.version}" if cgroup else "host",
            kills=kills,
            limit_bytes=limit,
            peak_bytes=peak,
            victims=tuple(dict.fromkeys(line.pid for line in lines)),
            kernel_lines=tuple(line.text for line in lines),
        )
        self._last = (key, evidence)
        return evidence

    def _limit_and_peak(self, cgroup: JobCgroup | None) -> tuple[int | None, int | None]:
        """The limit that was hit: the job's own, else the enclosing cgroup's (a job cgroup without
        --mem-limit is killed by the container's limit, which the kernel charges up the hierarchy)."""
        if cgroup is None:
            return None, None  # a host-wide OOM: no limit to name
        for source in (cgroup, self.enclosing if cgroup is not self.enclosing else None):
            stats = source.memory_stats() if source else None
            if stats and stats.limit_bytes is not None:
                return stats.limit_bytes, stats.peak_bytes
        stats = cgroup.memory_stats()
        return None, stats.peak_bytes if stats else None

    def close(self) -> None:
        self.kernel_log.close()


def _same_memcg(printed: str, ours: str) -> bool:
    """The kernel prints the path from the hierarchy's real root; inside a cgroup namespace we see a
    shorter one, so ours may be a suffix of what it printed."""
    return printed == ours or printed.endswith(ours if ours.startswith("/") else "/" + ours)

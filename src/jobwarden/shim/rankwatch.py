"""Where each rank of a distributed job is, watched by the speed watch (DESIGN.md "Ranks"): every tick, the
main thread of each rank process (at most MAX_RANKS of them) is looked at, cheapest first: its state from
the tree's own stat line (free: already read), and, when it is not running, the system call it is blocked
in (/proc/PID/task/PID/syscall, one small read; rules.speed.ranks.where_of says what it means). Every
READ_EVERY_S the rank's own cpu cgroup is read (its quota, its throttling: a rank moved into a cgroup of
its own is held back alone), and its cgroup looked up again every CGROUP_EVERY_S.

The looks of the last WINDOW_S are kept per rank: their shares are where its time went (the straggler's
evidence), and the last one is where it is now (`status`'s `ranks`). A rank is the topmost process that
carries it (its DataLoader workers and other children inherit RANK from it and are no rank of their own).

Measured cost (scripts/bench-ranks): see docs/measurements.md."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from jobwarden.errors import ProcessGone
from jobwarden.model import ProcessId
from jobwarden.osapi.cpuquota import CpuCgroup, CpuStat, cpu_cgroup_of
from jobwarden.osapi.procfs import ProcFS
from jobwarden.rules.speed.evidence import RankView
from jobwarden.rules.speed.loading import LOADER_WORKER_COMM
from jobwarden.rules.speed.ranks import SYSCALL_NAMES, WHERE, where_of

if TYPE_CHECKING:
    from jobwarden.shim.tree import Member

MAX_RANKS = 16  # rank processes looked at each tick, lowest ranks first
WINDOW_S = 20.0  # as the speed watch's window
CGROUP_EVERY_S = 10.0  # a rank's cpu cgroup looked up again (a rank may be moved into one of its own)


class _Rank:
    """What is kept of one rank process."""

    def __init__(self, member: Member) -> None:
        ranks = member.ranks
        assert ranks is not None and ranks.rank is not None
        self.rank, self.local_rank, self.node = ranks.rank, ranks.local_rank, ranks.group_rank
        self.pid = member.pid
        self.looks: deque[tuple[float, str, str]] = deque()  # (mono, where, detail)
        self.steps: deque[tuple[float, int]] = deque()  # (mono, step) where its own bar moved
        self.cgroup: CpuCgroup | None = None
        self.cgroup_at = -CGROUP_EVERY_S
        self.cpu: deque[tuple[float, CpuStat]] = deque()

    def trim(self, mono: float) -> None:
        for kept in (self.looks, self.steps, self.cpu):
            while len(kept) > 1 and kept[0][0] < mono - WINDOW_S:
                kept.popleft()


class RankWatch:
    def __init__(self, procfs: ProcFS, machine: str | None = None) -> None:
        self.procfs = procfs
        self.syscalls = SYSCALL_NAMES.get(machine or os.uname().machine, {})
        self._ranks: dict[ProcessId, _Rank] = {}

    def tick(self, mono: float, members: Iterable[Member], steps: Mapping[int, int] | None = None) -> None:
        """One look at every rank's main thread; their own step counters where the hooks saw a bar."""
        members = list(members)
        ranked = rank_processes(members)
        present = {m.ident for m in ranked}
        for ident in [i for i in self._ranks if i not in present]:
            del self._ranks[ident]
        if not ranked:
            return
        loaders = {m.ppid for m in members if m.comm == LOADER_WORKER_COMM}
        for m in ranked:
            kept = self._ranks.get(m.ident)
            if kept is None:
                kept = self._ranks[m.ident] = _Rank(m)
            state = m.snapshot.state if m.snapshot else "?"
            syscall = None
            if state not in ("R", "Z", "X"):
                with contextlib.suppress(ProcessGone):
                    number = self.procfs.main_thread_syscall(m.pid)
                    syscall = None if number is None else self.syscalls.get(number, f"syscall {number}")
            kept.looks.append((mono, *where_of(state, syscall, m.pid in loaders)))
            step = steps.get(m.pid) if steps else None
            if step is not None and (not kept.steps or kept.steps[-1][1] != step):
                if kept.steps and step < kept.steps[-1][1]:
                    kept.steps.clear()  # a new bar
                kept.steps.append((mono, step))
            kept.trim(mono)

    def read(self, mono: float) -> None:
        """Each rank's own cpu cgroup: looked up now and then, its cpu.stat read each time."""
        for kept in self._ranks.values():
            if mono - kept.cgroup_at >= CGROUP_EVERY_S:
                kept.cgroup_at = mono
                kept.cgroup = cpu_cgroup_of(kept.pid, str(self.procfs.root))
            stat = kept.cgroup.cpu_stat() if kept.cgroup else None
            if stat is not None:
                kept.cpu.append((mono, stat))
            kept.trim(mono)

    def __bool__(self) -> bool:
        return bool(self._ranks)

    def views(
        self,
        first: Mapping[ProcessId, tuple[int, int, int, int]],
        last: Mapping[ProcessId, tuple[int, int, int, int]],
        window_s: float,
    ) -> tuple[RankView, ...]:
        """Each rank over the window; `first`/`last`: the speed watch's schedstat reads at its ends."""
        found = []
        for ident, kept in sorted(self._ranks.items(), key=lambda kv: kv[1].rank):
            e1, d1 = last.get(ident, (0, 0, 0, 0))[:2]
            e0, d0 = first.get(ident, (0, 0, 0, 0))[:2]
            ran, waited = max(e1 - e0, 0) / 1e9, max(d1 - d0, 0) / 1e9
            found.append(
                RankView(
                    **self._where(kept),
                    step=kept.steps[-1][1] if kept.steps else None,
                    rate=_rate(kept.steps),
                    cpu_used=ran / window_s if window_s > 0 else 0.0,
                    wait_share=waited / (ran + waited) if ran + waited > 0 else 0.0,
                    **self._quota(kept),
                )
            )
        return tuple(found)

    def rows(self) -> list[dict[str, Any]]:
        """`status --json`'s `ranks` (store.rankfile keeps them for the frontends)."""
        return [
            {
                "rank": v.rank,
                "local_rank": v.local_rank,
                "node": v.node,
                "pid": v.pid,
                "step": v.step,
                "rate": None if v.rate is None else round(v.rate, 3),
                "where": v.where,
                "where_detail": v.where_detail,
                "shares": {w: round(s, 2) for w, s in v.shares},
            }
            for v in self.views({}, {}, 0.0)
        ]

    def _where(self, kept: _Rank) -> dict[str, Any]:
        counts = dict.fromkeys(WHERE, 0)
        idle: dict[str, int] = {}
        for _, where, detail in kept.looks:
            counts[where] += 1
            if where == "idle":
                idle[detail] = idle.get(detail, 0) + 1
        n = len(kept.looks)
        shares = tuple(sorted(((w, c / n) for w, c in counts.items() if c), key=lambda ws: -ws[1]))
        last = kept.looks[-1] if kept.looks else (0.0, "unknown", "")
        return {
            "rank": kept.rank,
            "pid": kept.pid,
            "local_rank": kept.local_rank,
            "node": kept.node,
            "looks": n,
            "shares": shares,
            "where": last[1],
            "where_detail": last[2],
            "idle_detail": max(idle, key=lambda d: idle[d]) if idle else "",
        }

    def _quota(self, kept: _Rank) -> dict[str, Any]:
        cg = kept.cgroup
        if cg is None or cg.quota_cpus is None or len(kept.cpu) < 2:
            return {}
        before, after = kept.cpu[0][1], kept.cpu[-1][1]
        periods = after.nr_periods - before.nr_periods
        share = (after.nr_throttled - before.nr_throttled) / periods if periods > 0 else 0.0
        return {"quota_cpus": cg.quota_cpus, "throttled_share": share}


def rank_processes(members: Iterable[Member]) -> list[Member]:
    """The processes that are a rank: they carry one that their parent does not (a rank's children
    inherit its variables), lowest rank first, at most MAX_RANKS."""
    members = list(members)
    by_pid = {m.pid: m for m in members}
    found = []
    for m in members:
        if m.ranks is None or m.ranks.rank is None:
            continue
        parent = by_pid.get(m.ppid)
        if parent is not None and parent.ranks is not None and parent.ranks.rank == m.ranks.rank:
            continue
        found.append(m)
    found.sort(key=lambda m: (m.ranks.rank if m.ranks else 0, m.pid))
    return found[:MAX_RANKS]


def _rate(steps: deque[tuple[float, int]]) -> float | None:
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return None
    return (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])

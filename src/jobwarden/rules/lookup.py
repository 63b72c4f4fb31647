"""The run's processes, stacks and deaths indexed by pid: what several rules ask of the same evidence."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobwarden.observations import ProcessDeath, ProcessFacts, ProcessStack
from jobwarden.rules.evidence import RunEvidence


@dataclass(frozen=True)
class Lookup:
    processes: dict[int, ProcessFacts] = field(default_factory=dict)
    stacks: dict[int, ProcessStack] = field(default_factory=dict)
    deaths: dict[int, ProcessDeath] = field(default_factory=dict)

    @classmethod
    def of(cls, ev: RunEvidence) -> Lookup:
        return cls(
            {p.pid: p for p in ev.processes},
            {s.pid: s for s in ev.stacks},
            {d.pid: d for d in ev.deaths},
        )

    def children(self, pid: int) -> list[ProcessFacts]:
        return [p for p in self.processes.values() if p.ppid == pid]

    def live_stacks(self) -> list[ProcessStack]:
        """Stacks of processes still alive. Without process facts every stack counts as live: the caller
        gathered stacks only."""
        if not self.processes:
            return list(self.stacks.values())
        return [s for pid, s in self.stacks.items() if pid in self.processes]

    def cmdline(self, pid: int) -> str:
        for source in (self.processes.get(pid), self.deaths.get(pid), self.stacks.get(pid)):
            if source is not None and source.cmdline:
                return source.cmdline
        return "?"


def count(n: int, noun: str) -> str:
    """'1 rank', '3 ranks'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe(pid: int, cmdline: str, width: int = 80) -> str:
    """'pid 42 (python train.py --lr 3e-4)', the command cut to stay readable; 'pid 42' when unknown."""
    if not cmdline or cmdline == "?":
        return f"pid {pid}"
    cmd = cmdline if len(cmdline) <= width else cmdline[: width - 3] + "..."
    return f"pid {pid} ({cmd})"

"""How each process of the job ended, from whichever source knew: the shim's own reaping (its children),
the kernel's exit event or a Python parent's reaping (via `Sightings`), the zombie's /proc entry, or the
pidfd (PIDFD_INFO_EXIT, Linux >= 6.15).

It also turns births into members at once (a pidfd opened as the process is born), and records the deaths
of processes the shim never held at all: they lived a few milliseconds, and only an event told of them.
"""

from __future__ import annotations

import time
from typing import TypeVar

from jobwarden.model import ProcessEnd
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.process import reap_any
from jobwarden.shim.tree.jobtree import JobTree, Member
from jobwarden.shim.tree.sightings import Birth, Death, Sightings

_REMEMBERED = 4096  # births and ends kept for a death report that comes later; oldest forgotten first
V = TypeVar("V")


class ExitCollector:
    def __init__(self, tree: JobTree, sightings: Sightings | None = None) -> None:
        self.tree = tree
        self.sightings = sightings
        self.reaped: dict[int, int] = {}  # wait statuses of the shim's own children, by pid
        self._told: dict[int, tuple[int, float]] = {}  # pid -> (status, moment of death) from an event
        self._unheld: dict[int, Birth] = {}  # born, but gone before a pidfd could be opened
        self._unknown: dict[int, ProcessEnd] = {}  # ended with no status yet: a later report fills it in
        self._gone: dict[int, None] = {}  # pids recorded ended, oldest first: a late report is not news
        self.helper_cpu_s: dict[int, float] = {}  # CPU seconds of children reaped that were not members
        self._news = False  # a birth or death of the job's came by an event (take_news)
        self._followed: tuple[frozenset[int], int | None] | None = None  # what the kernel's filter lets by
        self._held_at_fork: list[int] = []  # members added since the filter was last set: not followed yet

    def fds(self, kernel: bool = True) -> list[int]:
        """What to wait on for births and deaths; kernel=False: not the host's process events (muted)."""
        return self.sightings.fds(kernel) if self.sightings else []

    def kernel_fd(self) -> int | None:
        listener = self.sightings.listener if self.sightings else None
        return listener.fileno() if listener is not None else None

    def take_news(self) -> bool:
        """Whether a birth or death of the job's came since the last call."""
        news, self._news = self._news, False
        return news

    def collect(self, now: float, main: Member | None = None) -> list[ProcessEnd]:
        """Every end known now: members whose pidfd fired, and processes the shim never held. The main
        process, when adopted (reaped by init, not by us), is waited for until its status is out."""
        for pid, raw, cpu_s in reap_any():
            self.reaped[pid] = raw
            if pid not in self.tree.members:  # a helper (the automatic profile): what it cost
                _remember(self.helper_cpu_s, pid, cpu_s)
        ends = self._from_events() if self.sightings else []
        for member in self.tree.exited():
            end = self._end_of(member, now)
            if end.status is None and member is main:
                end = end._replace(status=_non_child_status(member))
            ends.append(end)
            self.tree.drop(member)
        # forget statuses of pids we never tracked: their numbers may be reused by new members
        self.reaped = {p: s for p, s in self.reaped.items() if p in self.tree.members}
        return ends

    def _end_of(self, member: Member, now: float) -> ProcessEnd:
        status = self.reaped.pop(member.pid, None)
        told = self._told.pop(member.pid, None)
        if status is None and told is not None:
            status = told[0]
        if status is None:
            status = self.tree.zombie_status(member)
        if status is None:
            status = pidfds.exit_status(member.pidfd)
        end = ProcessEnd(
            member.pid,
            member.ident.start_time,
            status,
            told[1] if told else now,
            member.ppid,
            member.cmdline,
            member.ranks,
        )
        _remember(self._gone, member.pid, None)
        if status is None:
            _remember(self._unknown, member.pid, end)
        return end

    # --- events -----------------------------------------------------------------------------------

    def _from_events(self) -> list[ProcessEnd]:
        assert self.sightings is not None
        mark = self.sightings.mark()  # before the drain: whoever is born from now on may be the job's
        births, deaths = self.sightings.drain()
        for birth in births:
            self._on_birth(birth)
        ends = [end for death in deaths if (end := self._on_death(death)) is not None]
        if births or deaths or self._followed is None:  # a newer window: the host's newcomers drop out
            self.follow(mark)
        else:
            self.follow()
        return ends

    def follow(self, born_after: int | None = None) -> None:
        """The kernel's filter follows the members (and, with born_after, the processes born since):
        set again when they changed or a newer mark came, never for nothing."""
        if self.sightings is None:
            return
        members = frozenset(self.tree.members)
        if born_after is None:
            if self._followed is None or self._followed[0] == members:
                return
            born_after = self._followed[1]  # the window stays as wide as it was
        self._followed = (members, born_after)
        self.sightings.follow(members, born_after)
        # an exec between a member's fork event and this moment reached no one: its new command and RANK
        # are read now; a later one passes the filter
        held, self._held_at_fork = self._held_at_fork, []
        for pid in held:
            self.tree.refresh(pid)

    def _ours(self, parent: int) -> bool:
        """A child of one of the job's processes. Not a child of the shim itself: those are its own helpers
        (py-spy, --on-event hooks), and the job's main process is held from its spawn. A pid of a member
        that ended is not enough either: the number may already belong to another process."""
        return parent in self.tree.members

    def _on_birth(self, birth: Birth) -> None:
        # the kernel reports every fork of the host: only children of the job's processes are ours; a
        # process that announced itself runs the hooks with this run's py dir
        if birth.exec:
            self._news = self._news or birth.pid in self.tree.members
            self.tree.refresh(birth.pid)  # torchrun's rank is its child until exec gives it its RANK
            return
        known = self.tree.members.get(birth.pid)
        if known is not None:  # held since the kernel's fork event: the hooks' line may name its rank
            same = birth.start_time is None or known.ident.start_time == birth.start_time
            if birth.announced and same and known.ranks is None and birth.ranks is not None:
                known.ranks = birth.ranks
            return
        if not (birth.announced or self._ours(birth.ppid)):
            return
        self._news = True
        member = self.tree.add_pid(birth.pid, birth.start_time)
        if member is not None:
            self._held_at_fork.append(birth.pid)
            if member.ranks is None and birth.ranks is not None:
                member.ranks = birth.ranks
        elif birth.pid not in self._gone:
            _remember(self._unheld, birth.pid, birth)

    def _on_death(self, death: Death) -> ProcessEnd | None:
        if death.pid in self.tree.members or self._ours(death.ppid):
            self._news = True
        if death.pid in self.tree.members:
            self._told.setdefault(death.pid, (death.status, death.at))  # its pidfd fires next
            return None
        late = self._unknown.pop(death.pid, None)
        if late is not None:  # ended before the report came: its status, at last
            return late._replace(status=death.status)
        if death.pid in self._gone:
            return None  # already recorded with its status
        birth = self._unheld.pop(death.pid, None)
        if birth is None and not self._ours(death.ppid):
            return None  # another process of the host
        start_time = (birth.start_time if birth else None) or 0  # 0: never read
        _remember(self._gone, death.pid, None)
        return ProcessEnd(
            death.pid,
            start_time,
            death.status,
            death.at,
            death.ppid,
            self._cmdline_of_parent(death.ppid),
            birth.ranks if birth else None,
        )

    def _cmdline_of_parent(self, ppid: int) -> str:
        """A process that died before its /proc entry could be read: forked from its parent, it most
        likely still ran the parent's program (a fork-started worker)."""
        parent = self.tree.members.get(ppid)
        return f"[child of pid {ppid}] {parent.cmdline}" if parent else f"[child of pid {ppid}]"

    def close(self) -> None:
        if self.sightings is not None:
            self.sightings.close()


def _remember(table: dict[int, V], pid: int, value: V) -> None:
    """Keep `value` for `pid`, newest last; a table past _REMEMBERED forgets its oldest entry (a job that
    forks 100 processes a second for days must not grow the shim)."""
    table.pop(pid, None)
    table[pid] = value
    if len(table) > _REMEMBERED:
        del table[next(iter(table))]


def _non_child_status(member: Member) -> int | None:
    """An adopted main process is reaped by init: PIDFD_INFO_EXIT appears once it has been."""
    for _ in range(50):
        status = pidfds.exit_status(member.pidfd)
        if status is not None:
            return status
        time.sleep(0.02)  # init reaps within milliseconds; this is the shim, not a test
    return None

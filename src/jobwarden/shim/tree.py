"""The job's process tree: discovered continuously, each member held by (pid, start time) and a pidfd.

Sources, cheapest first: the job's cgroup; parent links read from /proc (this kernel family often lacks
/proc/PID/task/*/children, so we read every new pid's stat once); the job's session; processes reparented
to the shim (it is a subreaper, so double-forked descendants come back to it); and, on full scans, the
JOBWARDEN_* marker variables, which find what escaped everything else.
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import Callable
from dataclasses import dataclass

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import ProcessId, ProcessSnapshot
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.osapi.procfs import ProcFS, ProcStat


@dataclass
class Member:
    ident: ProcessId
    pidfd: int
    ppid: int
    cmdline: str
    comm: str = ""
    last_ticks: int | None = None
    last_at: float | None = None

    @property
    def pid(self) -> int:
        return self.ident.pid


class JobTree:
    def __init__(
        self, procfs: ProcFS, shim_pid: int, markers: dict[str, str], cgroup: JobCgroup | None = None
    ) -> None:
        self.procfs = procfs
        self.shim_pid = shim_pid
        self.markers = markers
        self.cgroup = cgroup
        self.members: dict[int, Member] = {}
        self.sessions: set[int] = set()
        self._ended: set[ProcessId] = set()
        self._foreign: set[int] = set()  # pids seen and found not ours; re-checked on full scans
        # the shim's own helpers (--on-event hooks): its children too, in sessions of their own; never members
        self.helpers: Callable[[], set[int]] = set

    def __len__(self) -> int:
        return len(self.members)

    def add(self, st: ProcStat) -> Member | None:
        """Start tracking a process: open its pidfd first, then re-check its identity, so a pid that died
        and was reused between our read and the open is never mistaken for a member."""
        ident = ProcessId(st.pid, st.start_time)
        if ident in self._ended or st.pid in self.members or st.state in ("Z", "X"):
            return None
        try:
            fd = pidfds.open_pidfd(st.pid)
        except (ProcessGone, AccessDenied):
            return None
        if not self.procfs.identity_matches(st.pid, st.start_time):
            pidfds.close(fd)
            return None
        try:
            cmdline = self.procfs.cmdline(st.pid)
        except ProcessGone:
            cmdline = f"[{st.comm}]"
        member = Member(ident, fd, st.ppid, cmdline, st.comm)
        self.members[st.pid] = member
        return member

    def seed(self, pid: int, session_leader: bool = False) -> Member | None:
        st = self.procfs.stat(pid)
        if session_leader:
            self.sessions.add(st.sid)
        return self.add(st)

    def seed_child(self, pid: int) -> Member:
        """Track our own freshly spawned child. It cannot be reused before we reap it, so even a zombie
        (a command that failed within microseconds) is tracked, and its status collected."""
        st = self.procfs.stat(pid)
        self.sessions.add(st.sid)
        member = Member(
            ProcessId(pid, st.start_time),
            pidfds.open_pidfd(pid),
            st.ppid,
            self.procfs.cmdline(pid) if st.state != "Z" else f"[{st.comm}]",
            st.comm,
        )
        self.members[pid] = member
        return member

    def discover(self, full: bool = False) -> list[Member]:
        """Find new members. A full scan also re-reads every pid and checks the marker variables."""
        if full:
            self._foreign.clear()
        pids = self.procfs.pids()
        live = set(pids)
        self._foreign &= live  # forget exited foreigners, so their reused pids are read again
        in_cgroup = set(self.cgroup.pids()) if self.cgroup else set()
        helpers = self.helpers()
        for pid in helpers & set(self.members):  # seen in the instant between its spawn and its naming
            self.drop(self.members[pid])
        fresh: dict[int, ProcStat] = {}
        for pid in pids:
            if pid in self.members or pid in self._foreign or pid == self.shim_pid:
                continue
            with contextlib.suppress(ProcessGone, AccessDenied):
                st = self.procfs.stat(pid)
                if pid not in helpers and st.sid not in helpers:
                    fresh[pid] = st
        added = []
        changed = True
        while changed:  # a child can be read before its parent: iterate to a fixed point
            changed = False
            for pid, st in list(fresh.items()):
                if self._belongs(st, in_cgroup, full):
                    del fresh[pid]
                    member = self.add(st)
                    if member:
                        added.append(member)
                        changed = True
        self._foreign.update(fresh)
        return added

    def _belongs(self, st: ProcStat, in_cgroup: set[int], full: bool) -> bool:
        if st.pid in in_cgroup or st.ppid in self.members or st.ppid == self.shim_pid:
            return True
        if st.sid in self.sessions:
            return True
        if full and self.markers:
            with contextlib.suppress(ProcessGone, AccessDenied):
                return self.procfs.environ_has(st.pid, self.markers)
        return False

    def exited(self) -> list[Member]:
        """Members whose pidfd says they have exited. The caller reads their status, then `drop`s them."""
        if not self.members:
            return []
        ready = _readable([m.pidfd for m in self.members.values()], 0)
        return [m for m in self.members.values() if m.pidfd in ready]

    def drop(self, member: Member) -> None:
        self.members.pop(member.pid, None)
        self._ended.add(member.ident)
        pidfds.close(member.pidfd)

    def zombie_status(self, member: Member) -> int | None:
        """While a zombie, /proc/PID/stat field 52 holds its wait status (same uid only)."""
        try:
            st = self.procfs.stat(member.pid)
        except (ProcessGone, AccessDenied):
            return None
        return st.exit_code if st.start_time == member.ident.start_time and st.state == "Z" else None

    def sample(self, now: float) -> list[ProcessSnapshot]:
        snaps = []
        for member in list(self.members.values()):
            try:
                st = self.procfs.stat(member.pid)
            except (ProcessGone, AccessDenied):
                continue
            if st.start_time != member.ident.start_time:
                continue
            cpu = None
            if member.last_ticks is not None and member.last_at is not None and now > member.last_at:
                cpu = (
                    100.0
                    * (st.cpu_ticks - member.last_ticks)
                    / self.procfs.ticks_per_s
                    / (now - member.last_at)
                )
            if st.comm != member.comm:  # it exec'd since we first saw it (a fork that became `sleep`)
                member.comm = st.comm
                with contextlib.suppress(ProcessGone):
                    member.cmdline = self.procfs.cmdline(st.pid)
            member.last_ticks, member.last_at, member.ppid = st.cpu_ticks, now, st.ppid
            snaps.append(
                ProcessSnapshot(
                    pid=st.pid,
                    ppid=st.ppid,
                    start_time=st.start_time,
                    state=st.state,
                    cmdline=member.cmdline,
                    rss_bytes=st.rss_pages * self.procfs.page_size,
                    cpu_percent=None if cpu is None else round(cpu, 1),
                )
            )
        return snaps

    def close(self) -> None:
        for member in list(self.members.values()):
            pidfds.close(member.pidfd)
        self.members.clear()


def _readable(fds: list[int], timeout_s: float | None) -> set[int]:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(None if timeout_s is None else int(timeout_s * 1000))}


def wait_readable(fds: list[int], timeout_s: float | None) -> set[int]:
    """Block until one of `fds` is readable or the timeout (None: none) passes. poll, not select: no
    FD_SETSIZE limit on a 1000-process tree."""
    return _readable(fds, None if timeout_s is None else max(0.0, timeout_s))

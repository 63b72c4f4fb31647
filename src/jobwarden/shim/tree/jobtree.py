"""The job's process tree: discovered continuously, each member held by (pid, start time) and a pidfd.

Sources, cheapest first: the job's cgroup; parent links read from /proc (this kernel family often lacks
/proc/PID/task/*/children, so we read every new pid's stat once); the job's session; processes reparented
to the shim (it is a subreaper, so double-forked descendants come back to it); and, on full scans, the
JOBWARDEN_* marker variables, which find what escaped everything else.

The shim runs this every second for days, so the hot paths read /proc with bare os calls, parse a stat
line only when its bytes changed (an idle process's do not), read a process's environment once per
process, and say when a tick found nothing worth writing.
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.model import RANK_VARIABLES, ProcessId, ProcessSnapshot, Ranks, ranks_from
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.osapi.procfs import ProcFS, ProcStat, parse_stat
from jobwarden.paths import STORE_ENV

_STORE_KEY = f"\0{STORE_ENV}=".encode()
# An unchanged tree is written to the store again after this long anyway, so its latest sample stays recent.
RECORD_AT_LEAST_EVERY_S = 10.0
MAX_ANCESTORS = 64  # parent links followed to find whether a process descends from the job


class Member:
    """A process of the job, held by its pidfd, with what the last sample saw of it. A plain class,
    not a dataclass: the shim builds it before it answers `run` (see jobwarden.model)."""

    __slots__ = (
        "cmdline",
        "comm",
        "ident",
        "last_at",
        "last_ticks",
        "pidfd",
        "ppid",
        "ranks",
        "raw_stat",
        "snapshot",
    )

    def __init__(
        self,
        ident: ProcessId,
        pidfd: int,
        ppid: int,
        cmdline: str,
        comm: str = "",
        ranks: Ranks | None = None,
    ) -> None:
        self.ident = ident
        self.pidfd = pidfd
        self.ppid = ppid
        self.cmdline = cmdline
        self.comm = comm
        self.ranks = ranks
        self.last_ticks: int | None = None
        self.last_at: float | None = None
        self.raw_stat = b""  # the stat line behind `snapshot`
        self.snapshot: ProcessSnapshot | None = None

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
        self._unmarked: dict[int, int] = {}  # pid -> start time of a process whose environment lacks markers
        self._proc = str(procfs.root)
        self._uid = os.geteuid()  # the job's: it runs as its shim does
        self._marker_entries = [f"\0{k}={v}\0".encode() for k, v in markers.items() if k != STORE_ENV]
        # the database's mark: another database's (same job ids, after a reset) is never ours; none at all
        # predates the mark
        self._store_mark = f"\0{STORE_ENV}={markers[STORE_ENV]}\0".encode() if STORE_ENV in markers else None
        self._exits = select.poll()  # every member's pidfd, kept registered
        self._recorded: tuple[list[ProcessSnapshot], float] | None = None
        # start time of the job's first process: an older process cannot have inherited its markers
        self._job_born: int | None = None
        # the shim's own helpers (--on-event hooks): its children too, in sessions of their own; never members
        self.helpers: Callable[[], set[int]] = set
        # --keep-running: released at the run's end, never taken back; nor are processes they start
        self.kept: dict[int, ProcessId] = {}

    def __len__(self) -> int:
        return len(self.members)

    def every_pid(self) -> set[int]:
        """Every pid the run has had, the ended ones too: an OOM victim is dead by the time it is looked
        for, and the kernel log names it by pid."""
        return set(self.members) | {ident.pid for ident in self._ended}

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
        member = Member(ident, fd, st.ppid, cmdline, st.comm, self._ranks(st.pid))
        self._track(member)
        return member

    def add_pid(self, pid: int, start_time: int | None = None) -> Member | None:
        """Track a process announced by a birth event (the kernel's, or the Python hooks'), at once: a
        pidfd opened now is what later yields its exit status. None if it is gone, already ours, or not
        the process announced (`start_time` differs)."""
        if pid in self.members or pid == self.shim_pid:
            return None
        try:
            st = self.procfs.stat(pid)
        except (ProcessGone, AccessDenied):
            return None
        if start_time is not None and st.start_time != start_time:
            return None
        return self.add(st)

    def refresh(self, pid: int) -> None:
        """A member ran exec(): its command and its ranks (the environment exec gave it) are new."""
        member = self.members.get(pid)
        if member is None:
            return
        with contextlib.suppress(ProcessGone):
            member.cmdline = self.procfs.cmdline(pid)
        member.ranks = self._ranks(pid) or member.ranks

    def seed(self, pid: int, session_leader: bool = False) -> Member | None:
        st = self.procfs.stat(pid)
        if session_leader:
            self.sessions.add(st.sid)
            self._job_born = st.start_time
        return self.add(st)

    def seed_child(self, pid: int) -> Member:
        """Track our own freshly spawned child. It cannot be reused before we reap it, so even a zombie
        (a command that failed within microseconds) is tracked, and its status collected."""
        st = self.procfs.stat(pid)
        self.sessions.add(st.sid)
        self._job_born = st.start_time
        member = Member(
            ProcessId(pid, st.start_time),
            pidfds.open_pidfd(pid),
            st.ppid,
            self.procfs.cmdline(pid) if st.state != "Z" else f"[{st.comm}]",
            st.comm,
            self._ranks(pid),
        )
        self._track(member)
        return member

    def _track(self, member: Member) -> None:
        self.members[member.pid] = member
        self._exits.register(member.pidfd, select.POLLIN)

    def discover(self, full: bool = False) -> list[Member]:
        """Find new members. A full scan also re-reads every pid and checks the marker variables.

        With a cgroup, an incremental scan reads only the cgroup's list: whatever the job forks is born
        in it. Listing /proc (the costly part of a scan) is then left to full scans, which still find
        a process moved out of the cgroup, by its parent, session or markers."""
        in_cgroup = set(self.cgroup.pids()) if self.cgroup else set()
        if self.cgroup and not full:
            candidates = in_cgroup  # all ours: a pid once foreign may have been reused by the job
        else:
            if full:
                self._foreign.clear()
            pids = self.procfs.pids()
            live = set(pids)
            self._foreign &= live  # forget exited foreigners, so their reused pids are read again
            if full:
                self._unmarked = {p: t for p, t in self._unmarked.items() if p in live}
            candidates = live - self._foreign
        helpers = self.helpers()
        for pid in helpers & set(self.members):  # seen in the instant between its spawn and its naming
            self.drop(self.members[pid])
        fresh: dict[int, ProcStat] = {}
        for pid in candidates:
            if pid in self.members or pid == self.shim_pid:
                continue
            raw = self._read_stat(pid)
            if raw:
                st = parse_stat(raw.decode("utf-8", "replace"))
                if pid not in helpers and st.sid not in helpers:
                    fresh[pid] = st
        added = []
        changed = True
        while changed:  # a child can be read before its parent: iterate to a fixed point
            changed = False
            for pid, st in list(fresh.items()):
                if st.ppid in self.kept:  # started by a process kept past the run: kept with it
                    del fresh[pid]
                    self.kept[pid] = ProcessId(pid, st.start_time)
                    changed = True
                elif self._belongs(st, in_cgroup, full):
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
        if full and self.markers and self._may_be_marked(st):
            # A process's environment changes only by exec, which no process outside the job does with
            # the job's markers: one look per (pid, start time) is enough.
            if self._has_markers(st.pid) and self._marks_count(st):
                return True
            self._unmarked[st.pid] = st.start_time
        return False

    def _marks_count(self, st: ProcStat) -> bool:
        """Whether a marked process is the job's. Anyone can set the markers in a process's environment,
        and root reads every user's: a process of another uid carrying a root job's markers would be
        listed, counted against --mem-limit and judged (its SIGSTOP a finding) without this. A process
        of the job's own uid (the shim's: the job runs as it) counts by its markers alone; one of another
        uid only if it descends from the job (a job may change user: `setpriv`, `runuser`)."""
        try:
            if os.stat(f"{self._proc}/{st.pid}").st_uid == self._uid:
                return True
        except OSError:
            return False
        return self._descends_from_job(st)

    def _descends_from_job(self, st: ProcStat) -> bool:
        """Whether an ancestor of `st` is a member or the shim, walking parent links up to MAX_ANCESTORS."""
        ppid = st.ppid
        for _ in range(MAX_ANCESTORS):
            if ppid in self.members or ppid == self.shim_pid:
                return True
            raw = self._read_stat(ppid) if ppid > 1 else b""
            if not raw:
                return False
            ppid = parse_stat(raw.decode("utf-8", "replace")).ppid
        return False

    def _may_be_marked(self, st: ProcStat) -> bool:
        """Worth reading the environment of: not checked before, and not older than the job."""
        if self._job_born is not None and st.start_time < self._job_born:
            return False
        return self._unmarked.get(st.pid) != st.start_time

    def exited(self) -> list[Member]:
        """Members whose pidfd says they have exited. The caller reads their status, then `drop`s them."""
        if not self.members:
            return []
        ready = {fd for fd, _ in self._exits.poll(0)}
        return [m for m in self.members.values() if m.pidfd in ready]

    def release(self, member: Member) -> None:
        """Let a member run on past the run (--keep-running): no longer held, and never taken again."""
        self.kept[member.pid] = member.ident
        self.drop(member)

    def drop(self, member: Member) -> None:
        if self.members.pop(member.pid, None) is member:
            self._exits.unregister(member.pidfd)
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
            raw = self._read_stat(member.pid)
            if not raw:
                continue
            if raw == member.raw_stat and member.snapshot and member.snapshot.cpu_percent == 0.0:
                member.last_at = now  # not scheduled since the last look: the same snapshot, unparsed
                snaps.append(member.snapshot)
                continue
            st = parse_stat(raw.decode("utf-8", "replace"))
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
                self.refresh(st.pid)
            member.last_ticks, member.last_at, member.ppid = st.cpu_ticks, now, st.ppid
            member.raw_stat = raw
            member.snapshot = ProcessSnapshot(
                pid=st.pid,
                ppid=st.ppid,
                start_time=st.start_time,
                state=st.state,
                cmdline=member.cmdline,
                rss_bytes=st.rss_pages * self.procfs.page_size,
                cpu_percent=None if cpu is None else round(cpu, 1),
                ranks=member.ranks,
            )
            snaps.append(member.snapshot)
        return snaps

    def worth_recording(self, snaps: list[ProcessSnapshot], now: float) -> bool:
        """False when `snaps` are what was last recorded, and recently: an idle tree costs no write (its
        rows in the store are still true), yet its latest sample is never older than
        RECORD_AT_LEAST_EVERY_S. Unchanged members return the very same snapshot objects, so the
        comparison is by identity, member by member."""
        if self._recorded is None:
            return True
        last, at = self._recorded
        return snaps != last or not 0 <= now - at < RECORD_AT_LEAST_EVERY_S

    def recorded(self, snaps: list[ProcessSnapshot], now: float) -> None:
        self._recorded = (snaps, now)

    def _has_markers(self, pid: int) -> bool:
        """procfs.environ_has without splitting the environment into a set: on a busy machine a full
        scan meets many new processes, and some environments are large. Unreadable (another user's, a
        kernel thread's, a process gone) counts as unmarked."""
        environ = self._environ(pid)
        if environ is None or not all(marker in environ for marker in self._marker_entries):
            return False
        return self._store_mark is None or self._store_mark in environ or _STORE_KEY not in environ

    def _ranks(self, pid: int) -> Ranks | None:
        """The process's rank from its launcher's variables (model.ranks_from), read once as it joins: a
        launcher sets them before exec, and nothing outside the process changes them after."""
        environ = self._environ(pid)
        if environ is None or (b"RANK=" not in environ and b"SLURM_PROCID=" not in environ):
            return None
        values = {}
        for name in RANK_VARIABLES:
            key = b"\0" + name.encode() + b"="
            at = environ.find(key)
            if at >= 0:
                end = environ.find(b"\0", at + len(key))
                values[name] = environ[at + len(key) : end].decode("ascii", "replace")
        return ranks_from(values)

    def _environ(self, pid: int) -> bytes | None:
        """The raw environment with a NUL before every entry (so each is NUL-delimited); None when
        unreadable."""
        try:
            fd = os.open(f"{self._proc}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        chunks = [b"\0"]  # entries are NUL-terminated: a leading NUL makes each one NUL-delimited
        try:
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        return b"".join(chunks)

    def _read_stat(self, pid: int) -> bytes:
        """/proc/PID/stat in one read; b"" when the process is gone or not ours to read. (ProcFS.stat
        does the same through pathlib and a buffered file: several times the cost, every second.)"""
        try:
            fd = os.open(f"{self._proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return b""
        try:
            return os.read(fd, 4096)  # a stat line is well under 1 KiB
        except OSError:  # ESRCH: it exited between open and read
            return b""
        finally:
            os.close(fd)

    def close(self) -> None:
        for member in list(self.members.values()):
            self._exits.unregister(member.pidfd)
            pidfds.close(member.pidfd)
        self.members.clear()

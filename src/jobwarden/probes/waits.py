"""What each blocked thread of the job waits for, read from /proc alone (no ptrace, no signal): the system
call it sits in (`/proc/PID/task/TID/syscall`, readable by the shim, an ancestor of the job), the
descriptor that call names (`fd/N`, `fdinfo/N`), the file locks the kernel lists (`/proc/locks`), who
holds the other end of a pipe (every process's `fd/` whose link names the pipe's inode), and who holds the
other end of a TCP connection made on this machine (`/proc/net/tcp{,6}`: the same two addresses, swapped).

Only asked when the watchdog judges a run hung, and bounded: the job's own processes first, then at most
MAX_OTHERS other processes for a pipe's other end or a lock's holder, within BUDGET_S.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from jobwarden.errors import ProcessGone
from jobwarden.observations import Wait, WaitParty
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.syscalls import names_here
from jobwarden.osapi.unixdiag import UnixDiag
from jobwarden.osapi.users import user_name

MAX_OTHERS = 2000  # processes outside the job whose descriptors are read for a pipe's other end
MAX_SOCKETS = 64  # waiting sockets whose Unix peer is asked of the kernel (two questions each)
BUDGET_S = 0.5  # the whole probe's time, past which what is known is returned
_F_SETLKW, _F_OFD_SETLKW = 7, 38  # fcntl's waiting lock commands
_P_ALL, _P_PID = 0, 1  # waitid's idtype

_READS = {"read", "pread64", "readv"}
_RECEIVES = {"read", "readv", "recvfrom", "recvmsg"}  # on a socket: waiting for the peer to send
_WRITES = {"write", "writev"}
# restart_syscall: a timed sleep (or timed wait) that a signal or a ptrace attach interrupted goes on there
_SLEEPS = {"nanosleep", "clock_nanosleep", "restart_syscall"}
_WAITS = {"wait4", "waitid"}


def blocked_waits(
    pids: Iterable[int], parents: Mapping[int, int], procfs: ProcFS | None = None
) -> tuple[list[Wait], dict[int, WaitParty]]:
    """The waits of the job's processes (`pids`, with `parents` for their children), and who each wait
    leads to."""
    probe = _Probe(procfs or ProcFS(), set(pids), parents)
    waits = [w for pid in sorted(probe.job) for w in probe.process(pid)]
    waits = probe.resolve(waits)
    return waits, probe.parties(waits)


class _Probe:
    def __init__(self, procfs: ProcFS, job: set[int], parents: Mapping[int, int]) -> None:
        self.procfs, self.proc, self.job, self.parents = procfs, procfs.root, job, parents
        self.calls = names_here()
        self.deadline = time.monotonic() + BUDGET_S
        self.lock_fds: dict[tuple[int, int], int] = {}  # (pid, tid) -> the descriptor it locks

    # --- one process's blocked threads ------------------------------------------------------------

    def process(self, pid: int) -> list[Wait]:
        found = []
        for tid in self._tids(pid):
            line = _read(self.proc / str(pid) / "task" / str(tid) / "syscall")
            wait = self._wait(pid, tid, line) if line else None
            if wait is not None:
                found.append(wait)
        return found

    def _tids(self, pid: int) -> list[int]:
        try:
            return sorted(int(t) for t in os.listdir(self.proc / str(pid) / "task") if t.isdigit())
        except OSError:
            return []

    def _wait(self, pid: int, tid: int, line: str) -> Wait | None:
        call, args = parse_syscall(line, self.calls)
        if call is None:
            return None
        if call in _SLEEPS:
            return Wait(pid, tid, "sleep", call, "a sleep")
        if call in _WAITS:
            return self._child_wait(pid, tid, call, args)
        if call == "flock" or (call == "fcntl" and args[1] in (_F_SETLKW, _F_OFD_SETLKW)):
            self.lock_fds[(pid, tid)] = args[0]
            return Wait(pid, tid, "file-lock", call, self._fd_path(pid, args[0]))
        if call in _READS or call in _WRITES or call in _RECEIVES:
            target = self._fd_path(pid, args[0])
            if target.startswith("socket:[") and call in _RECEIVES:
                return Wait(pid, tid, "socket-read", call, target)
            if (call in _READS or call in _WRITES) and _is_pipe(self.proc, pid, args[0], target):
                return Wait(pid, tid, "pipe-read" if call in _READS else "pipe-write", call, target)
        return None

    def _child_wait(self, pid: int, tid: int, call: str, args: list[int]) -> Wait:
        children = tuple(sorted(p for p, parent in self.parents.items() if parent == pid and p in self.job))
        wanted = _pid_arg(args[0])
        if call == "waitid":
            wanted = _pid_arg(args[1]) if args[0] == _P_PID else -1
        if wanted > 0:
            return Wait(pid, tid, "child", call, f"child pid {wanted}", (wanted,))
        return Wait(pid, tid, "child", call, "any child", children)

    def _fd_path(self, pid: int, fd: int) -> str:
        try:
            return os.readlink(self.proc / str(pid) / "fd" / str(fd))
        except OSError:
            return f"fd {fd}"

    # --- the other side: a lock's holder, a pipe's other end ---------------------------------------

    def resolve(self, waits: list[Wait]) -> list[Wait]:
        locks = _read_locks(self.proc) if any(w.kind == "file-lock" for w in waits) else {}
        sockets = {w.thing for w in waits if w.kind == "socket-read"}
        peers = _tcp_peers(self.proc, sockets)
        peers.update(_unix_peers(sockets - peers.keys(), self.deadline))
        pipes = {w.thing for w in waits if w.kind in ("pipe-read", "pipe-write")} | {
            p for p, _ in peers.values()
        }
        ends = self._pipe_ends(pipes) if pipes else {}
        resolved = []
        for w in waits:
            if w.kind == "file-lock":
                fd = self.lock_fds.get((w.pid, w.tid), -1)
                holders = tuple(p for p in _holders(locks, _file_key(self.proc, w.pid, fd)) if p != w.pid)
                resolved.append(Wait(w.pid, w.tid, w.kind, w.call, w.thing, holders))
            elif w.kind in ("pipe-read", "pipe-write"):
                wanted = "write" if w.kind == "pipe-read" else "read"
                holders = tuple(sorted({p for p, mode in ends.get(w.thing, ()) if mode in (wanted, "both")}))
                resolved.append(Wait(w.pid, w.tid, w.kind, w.call, w.thing, holders))
            elif w.kind == "socket-read" and w.thing in peers:
                peer, address = peers[w.thing]
                holders = tuple(sorted({p for p, _ in ends.get(peer, ()) if p != w.pid}))
                resolved.append(Wait(w.pid, w.tid, w.kind, w.call, address, holders))
            elif w.kind != "socket-read":  # a socket whose peer is not on this machine: no far side known
                resolved.append(w)
        return resolved

    def _pipe_ends(self, pipes: set[str]) -> dict[str, set[tuple[int, str]]]:
        """Who holds each pipe (or socket) open, and how: the job's processes, then others while the budget
        lasts."""
        ends: dict[str, set[tuple[int, str]]] = {}
        others = [p for p in sorted(self.procfs.pids()) if p not in self.job][:MAX_OTHERS]
        for pid in [*sorted(self.job), *others]:
            if time.monotonic() > self.deadline:
                break
            for fd, target in _fds(self.proc, pid):
                if target in pipes:
                    ends.setdefault(target, set()).add((pid, _mode(self.proc, pid, fd)))
        return ends

    def parties(self, waits: list[Wait]) -> dict[int, WaitParty]:
        found = {}
        for pid in {p for w in waits for p in w.on}:
            found[pid] = WaitParty(pid, self._cmdline(pid), self._user(pid), pid in self.job)
        return found

    def _cmdline(self, pid: int) -> str:
        try:
            return self.procfs.cmdline(pid)
        except ProcessGone:
            return ""

    def _user(self, pid: int) -> str:
        try:
            return user_name(self.procfs.uid(pid))
        except ProcessGone:
            return "?"


# --- parsing ----------------------------------------------------------------------------------------


def parse_syscall(line: str, calls: Mapping[int, str]) -> tuple[str | None, list[int]]:
    """`/proc/PID/task/TID/syscall`: "NR ARG1..ARG6 SP PC" in a call, "running", or "-1 SP PC" (blocked
    outside a call). The call's name where it is one a wait can be read from, and its six arguments."""
    fields = line.split()
    if len(fields) < 7 or not fields[0].isdigit():
        return None, []
    try:
        args = [int(f, 16) for f in fields[1:7]]
    except ValueError:
        return None, []
    return calls.get(int(fields[0])), args


def parse_locks(text: str) -> dict[tuple[int, int, int], list[int]]:
    """/proc/locks: (major, minor, inode) -> the pids holding a lock on it (waiters' "->" lines left
    out). "1: FLOCK  ADVISORY  WRITE 777 08:01:1234 0 EOF"; the device is in hex, the inode decimal."""
    held: dict[tuple[int, int, int], list[int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if pid > 0:
            held.setdefault(key, []).append(pid)
    return held


def parse_tcp(text: str) -> list[tuple[str, str, str]]:
    """/proc/net/tcp and tcp6: (local address, remote address, inode) of each socket, the addresses as
    the kernel prints them (hex "0100007F:1F40")."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 10 and fields[9].isdigit() and fields[9] != "0":
            found.append((fields[1], fields[2], fields[9]))
    return found


def shown_address(hex_address: str) -> str:
    """'0100007F:1F40' -> '127.0.0.1:8000' (an IPv6 address is shown by its port alone)."""
    host, _, port = hex_address.partition(":")
    try:
        number = int(port, 16)
        if len(host) == 8:
            octets = [int(host[i : i + 2], 16) for i in range(0, 8, 2)]
            return f"{'.'.join(str(o) for o in reversed(octets))}:{number}"
    except ValueError:
        return hex_address
    return f"port {number}"


def _tcp_peers(proc: Path, sockets: set[str]) -> dict[str, tuple[str, str]]:
    """For each waiting socket ("socket:[INODE]") connected on this machine: its peer's "socket:[INODE]"
    (the connection with the two addresses swapped) and the address it is connected to."""
    if not sockets:
        return {}
    table = [row for name in ("tcp", "tcp6") for row in parse_tcp(_read(proc / "net" / name, 1 << 22))]
    by_ends = {(local, remote): inode for local, remote, inode in table}
    found = {}
    for local, remote, inode in table:
        mine = f"socket:[{inode}]"
        peer = by_ends.get((remote, local))
        if mine in sockets and peer is not None:
            found[mine] = (f"socket:[{peer}]", f"a TCP connection to {shown_address(remote)}")
    return found


def _unix_peers(sockets: set[str], deadline: float) -> dict[str, tuple[str, str]]:
    """For each waiting socket that is a connected Unix socket: its peer's "socket:[INODE]" and what it
    is connected to, in words (the path either end is bound to: a server's accepted connection carries
    it; neither has one in a socketpair)."""
    found: dict[str, tuple[str, str]] = {}
    inodes = [int(s[len("socket:[") : -1]) for s in sorted(sockets) if s[len("socket:[") : -1].isdigit()]
    if not inodes:
        return found
    with UnixDiag() as diag:
        for inode in inodes[:MAX_SOCKETS]:
            mine = diag.ask(inode) if time.monotonic() < deadline else None
            if mine is None or mine.peer is None:
                continue
            peer = diag.ask(mine.peer)
            path = (peer.path if peer is not None else "") or mine.path
            words = f"a Unix socket connected to {path}" if path else "a Unix socket pair"
            found[f"socket:[{inode}]"] = (f"socket:[{mine.peer}]", words)
    return found


def _read_locks(proc: Path) -> dict[tuple[int, int, int], list[int]]:
    return parse_locks(_read(proc / "locks", 1 << 20))


def _file_key(proc: Path, pid: int, fd: int) -> tuple[int, int, int] | None:
    """(major, minor, inode) of the file a waiter's descriptor names, as /proc/locks spells it (the
    descriptor itself is asked: the link's text may name a renamed or deleted file)."""
    try:
        st = os.stat(proc / str(pid) / "fd" / str(fd))
    except OSError:
        return None
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _holders(locks: Mapping[tuple[int, int, int], list[int]], key: tuple[int, int, int] | None) -> list[int]:
    """The lock's holders; by the inode alone when the device differs (an overlay shows its own device
    in stat, the lock may be listed under the layer's) and the inode is unambiguous."""
    if key is None:
        return []
    if key in locks:
        return locks[key]
    same = [pids for (_, _, inode), pids in locks.items() if inode == key[2]]
    return same[0] if len(same) == 1 else []


def _pid_arg(value: int) -> int:
    """A pid_t argument (32 bits, signed) as the register holds it: wait4(-1) reads 0xffffffff."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _is_pipe(proc: Path, pid: int, fd: int, target: str) -> bool:
    if target.startswith("pipe:["):
        return True
    try:
        return stat.S_ISFIFO(os.stat(proc / str(pid) / "fd" / str(fd)).st_mode)
    except OSError:
        return False


def _fds(proc: Path, pid: int) -> list[tuple[int, str]]:
    folder = proc / str(pid) / "fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        try:
            found.append((int(name), os.readlink(folder / name)))
        except (OSError, ValueError):
            continue
    return found


def _mode(proc: Path, pid: int, fd: int) -> str:
    """How the descriptor was opened, from fdinfo's octal flags."""
    for line in _read(proc / str(pid) / "fdinfo" / str(fd)).splitlines():
        if line.startswith("flags:"):
            try:
                access = int(line.split()[1], 8) & os.O_ACCMODE
            except (IndexError, ValueError):
                return "?"
            return {os.O_RDONLY: "read", os.O_WRONLY: "write", os.O_RDWR: "both"}.get(access, "?")
    return "?"


def _read(path: Path, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""

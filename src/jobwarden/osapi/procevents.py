"""The kernel's process-event connector (netlink CN_PROC): fork, exec and exit of every process of the host,
each exit with its wait status and the kernel's timestamp, as it happens.

It closes the gap a 1-second scan leaves: a worker killed 5 ms after it was born is named, with its status,
even when it was never seen alive and its parent reaped it at once. Who may listen:
- Linux >= 6.6 anyone (net-next bfdfdc2f3b70 "connector/cn_proc: Allow non-root users access"), earlier
  CAP_NET_ADMIN;
- only from the initial pid and user namespaces: drivers/connector/cn_proc.c ignores other requesters
  without an error, so `probe()` checks that events really arrive.

Layouts (include/uapi/linux/netlink.h, connector.h, cn_proc.h):
    struct nlmsghdr   { u32 len; u16 type; u16 flags; u32 seq; u32 pid; }                       16 bytes
    struct cn_msg     { u32 idx; u32 val; u32 seq; u32 ack; u16 len; u16 flags; u8 data[]; }     20 bytes
    struct proc_event { u32 what; u32 cpu; u64 timestamp_ns; union event_data; }  timestamp: ktime_get_ns
        fork: parent_pid, parent_tgid, child_pid, child_tgid
        exec: process_pid, process_tgid
        exit: process_pid, process_tgid, exit_code, exit_signal, parent_pid, parent_tgid
"""

from __future__ import annotations

# The C module, not `socket`: importing socket (its enums) costs 12 ms, and the shim opens the listener
# before it starts the job, on the path of `jobwarden run`; _socket costs 0.5 ms.
import _socket
import contextlib
import ctypes
import errno
import os
import select
import struct
import sys
import time
from collections.abc import Collection
from typing import NamedTuple

from jobwarden.errors import JobwardenError

_NETLINK_CONNECTOR = 11
_CN_IDX_PROC = _CN_VAL_PROC = 1
_NLMSG_DONE = 3
_MCAST_LISTEN, _MCAST_IGNORE = 1, 2
_FORK, _EXEC, _EXIT = 0x1, 0x2, 0x80000000
_NLMSG = struct.Struct("=IHHII")
_CN_MSG = struct.Struct("=IIIIHH")
_EVENT_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_FORK_DATA = struct.Struct("=iiii")
_EXEC_DATA = struct.Struct("=ii")
_EXIT_DATA = struct.Struct("=iiIIii")
_EVENT_AT = _NLMSG.size + _CN_MSG.size  # 36
_DATA_AT = _EVENT_AT + _EVENT_HEAD.size  # 52
_RCVBUF = 8 << 20  # the host's every fork and exit: room for bursts while the shim is busy elsewhere
_SO_RCVBUFFORCE = 33  # asm-generic/socket.h: beyond rmem_max, for CAP_NET_ADMIN
_PROBE_DEADLINE_S = 2.0


class ProcEventsUnavailable(JobwardenError):
    """The kernel will not send this process its process events."""


class ProcEvent(NamedTuple):
    kind: str  # "fork" | "exec" | "exit"
    pid: int  # the process (tgid) the event is about; for a fork, the new child
    ppid: int  # fork: the parent's tgid; exit: the parent's tgid as the kernel reports it; exec: 0
    at_ns: int  # the kernel's timestamp: CLOCK_MONOTONIC nanoseconds (ktime_get_ns)
    wait_status: int | None = None  # exit only: the status as waitpid() returns it (task->exit_code)


def parse(message: bytes) -> ProcEvent | None:
    """One netlink message of the connector; None for anything but a process's fork, exec or exit (a
    thread's, a UID change, a truncated message)."""
    if len(message) < _DATA_AT:
        return None
    what, _cpu, at_ns = _EVENT_HEAD.unpack_from(message, _EVENT_AT)
    try:
        if what == _FORK:
            _ppid, parent_tgid, child_pid, child_tgid = _FORK_DATA.unpack_from(message, _DATA_AT)
            # a new thread is a fork of a task too: only a new thread group is a new process
            return ProcEvent("fork", child_tgid, parent_tgid, at_ns) if child_pid == child_tgid else None
        if what == _EXEC:
            pid, tgid = _EXEC_DATA.unpack_from(message, _DATA_AT)
            return ProcEvent("exec", tgid, 0, at_ns) if pid == tgid else None
        if what == _EXIT:
            pid, tgid, code, _sig, _ppid, parent_tgid = _EXIT_DATA.unpack_from(message, _DATA_AT)
            # each thread reports its exit; the group leader's carries the process's status
            return ProcEvent("exit", tgid, parent_tgid, at_ns, code) if pid == tgid else None
    except struct.error:  # shorter than its kind needs
        return None
    return None


def _control(op: int, filtered: bool) -> bytes:
    """PROC_CN_MCAST_LISTEN/IGNORE. Since 6.6 the request may carry a `struct proc_input` naming the
    events wanted; earlier kernels accept only the bare 4-byte op (an 8-byte one is dropped silently)."""
    payload = struct.pack("=II", op, _FORK | _EXEC | _EXIT) if filtered else struct.pack("=I", op)
    cn = _CN_MSG.pack(_CN_IDX_PROC, _CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return _NLMSG.pack(_NLMSG.size + len(cn), _NLMSG_DONE, 0, 0, os.getpid()) + cn


def _kernel_filters() -> bool:
    release = os.uname().release.split(".")
    try:
        return (int(release[0]), int(release[1].split("-")[0])) >= (6, 6)
    except (IndexError, ValueError):
        return False


class ProcEventListener:
    def __init__(self, sock: _socket.socket, filtered: bool) -> None:
        self._sock = sock
        self._filtered = filtered
        self.lost = 0  # events the kernel dropped because the buffer was full (ENOBUFS)
        self.following: bool | None = None  # a pid filter is attached (None: never asked; False: refused)

    def follow(self, pids: Collection[int], born_after: int | None) -> bool:
        """Have the kernel drop every event but those of `pids` and of processes born after the pid
        `born_after` (see follow_filter). False when the kernel refuses the filter: every event comes."""
        code = follow_filter(pids if len(pids) <= MAX_FOLLOWED else None, born_after)
        buf = ctypes.create_string_buffer(b"".join(_INSN.pack(*insn) for insn in code))
        fprog = struct.pack("HxxxxxxQ", len(code), ctypes.addressof(buf))  # struct sock_fprog
        try:
            self._sock.setsockopt(_SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
        except OSError:
            self.following = False
            return False
        self.following = True
        return True

    @classmethod
    def open(cls) -> ProcEventListener:
        try:
            kind = _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC
            sock = _socket.socket(_socket.AF_NETLINK, kind, _NETLINK_CONNECTOR)
        except OSError as err:
            raise ProcEventsUnavailable(f"no netlink connector socket: {err.strerror}") from err
        try:
            _grow_buffer(sock)
            sock.bind((0, _CN_IDX_PROC))
            filtered = _kernel_filters()
            sock.send(_control(_MCAST_LISTEN, filtered))
            sock.setblocking(False)
        except OSError as err:
            sock.close()
            why = "needs CAP_NET_ADMIN before Linux 6.6" if err.errno == errno.EPERM else err.strerror
            raise ProcEventsUnavailable(f"the kernel's process events cannot be read: {why}") from err
        return cls(sock, filtered)

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> list[ProcEvent]:
        """Everything queued now; never blocks."""
        events: list[ProcEvent] = []
        while True:
            try:
                message = self._sock.recv(4096)
            except BlockingIOError:
                return events
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                self.lost += 1  # the kernel overran the buffer: events are missing, later ones follow
                continue
            event = parse(message)
            if event is not None:
                events.append(event)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.send(_control(_MCAST_IGNORE, self._filtered))
        self._sock.close()


# --- the kernel-side filter ---------------------------------------------------------------------------
# The connector sends every fork, exec and exit of the host to every listener: each supervisor parsed them
# all (74 a second on a busy 2-core machine, most of an idle supervisor's CPU). A classic BPF socket filter
# (Documentation/networking/filter.rst; SO_ATTACH_FILTER works on netlink sockets, as udev's monitors use
# it) lets through only what concerns the job:
#   fork  a process (not a thread) whose parent is followed, or was born after `born_after`;
#   exec  of a process followed;
#   exit  of a process (not a thread) followed, or whose parent is followed or born after `born_after`.
# `born_after` is the host's last pid when the supervisor last drained its events: a member born since is
# not followed yet, and its own children (a shell's, forked at once) must not be missed meanwhile.
# Offsets: nlmsghdr 16 + cn_msg 20 = 36: what; 52: the event's data (see parse).
MAX_FOLLOWED = 400  # 8 instructions a pid at most in the 4096 the kernel allows (BPF_MAXINSNS)
_SOL_SOCKET, _SO_ATTACH_FILTER = 1, 26
_INSN = struct.Struct("HBBI")  # struct sock_filter: code, jt, jf, k
_LD_B, _LD_W, _LDX_M, _ST = 0x30, 0x20, 0x61, 0x02  # BPF_LD|BPF_B|BPF_ABS, ...|BPF_W|..., LDX M[], ST M[]
_LSH, _ADD_X, _TAX = 0x64, 0x0C, 0x07
_JEQ, _JEQ_X, _JGT, _JA, _RET = 0x15, 0x1D, 0x25, 0x05, 0x06
_PASS, _DROP = 0xFFFFFFFF, 0


def follow_filter(pids: Collection[int] | None, born_after: int | None) -> list[tuple[int, int, int, int]]:
    """The filter's instructions; pids None: every process (only threads' events are dropped)."""
    asm = _Asm()
    asm.host_u32(36)  # what
    for what, label in ((_FORK, "fork"), (_EXEC, "exec"), (_EXIT, "exit")):
        asm.jump_if(_JEQ, what, label)
    asm.ret(_DROP)
    asm.label("fork")
    asm.same_fields(60, 64)  # child pid == child tgid: a new process, not a new thread
    asm.host_u32(56)  # parent tgid
    asm.followed(pids, born_after)
    asm.label("exec")
    asm.same_fields(52, 56)
    asm.host_u32(56)
    # not born after the mark: that let through the exec of every process the host started, waking every
    # supervisor on a busy machine. A child held at its fork that execs before the filter follows it is
    # read again once it is followed (shim.tree.exits: ExitCollector.follow).
    asm.followed(pids, None)
    asm.label("exit")
    asm.same_fields(52, 56)  # a thread's exit is no process's end
    asm.host_u32(56)
    asm.jump_if_among(pids, "pass")
    asm.host_u32(72)  # parent tgid
    asm.followed(pids, born_after)
    asm.label("pass")
    asm.ret(_PASS)
    return asm.resolve()


class _Asm:
    """Just enough of an assembler for follow_filter: forward jumps to labels, through BPF_JA (a
    conditional jump reaches 255 instructions at most)."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int, int, int | str]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def ret(self, value: int) -> None:
        self.code.append((_RET, 0, 0, value))

    def jump_if(self, op: int, value: int, label: str) -> None:
        self.code += [(op, 0, 1, value), (_JA, 0, 0, label)]  # true: the next one, the jump; false: past it

    def jump_if_among(self, pids: Collection[int] | None, label: str) -> None:
        if pids is None:
            self.code.append((_JA, 0, 0, label))
            return
        for pid in sorted(pids):
            self.jump_if(_JEQ, pid, label)

    def followed(self, pids: Collection[int] | None, born_after: int | None) -> None:
        """A (a pid) followed, or born after `born_after`: pass; else drop."""
        self.jump_if_among(pids, "pass")
        if born_after is not None:
            self.jump_if(_JGT, born_after, "pass")
        self.ret(_DROP)

    def same_fields(self, a: int, b: int) -> None:
        """Drop unless the u32 at `a` equals the one at `b` (the byte order does not matter to ==)."""
        self.code += [(_LD_W, 0, 0, a), (_TAX, 0, 0, 0), (_LD_W, 0, 0, b), (_JEQ_X, 1, 0, 0)]
        self.ret(_DROP)

    def host_u32(self, offset: int) -> None:
        """A = the u32 at `offset` in host byte order (BPF_LD|BPF_W reads network order), byte by byte."""
        weights = range(4) if sys.byteorder == "little" else range(3, -1, -1)  # byte i weighs 256**w
        first = True
        for i, weight in sorted(zip(range(4), weights, strict=True), key=lambda iw: -iw[1]):
            self.code.append((_LD_B, 0, 0, offset + i))
            if weight:
                self.code.append((_LSH, 0, 0, 8 * weight))
            if not first:
                self.code += [(_LDX_M, 0, 0, 0), (_ADD_X, 0, 0, 0)]
            self.code.append((_ST, 0, 0, 0))
            first = False

    def resolve(self) -> list[tuple[int, int, int, int]]:
        out = []
        for at, (op, jt, jf, k) in enumerate(self.code):
            if isinstance(k, str):  # BPF_JA: k counts from the next instruction
                k = self.labels[k] - at - 1
            out.append((op, jt, jf, k))
        return out


def last_pid(proc_root: str = "/proc") -> int | None:
    """The pid the kernel gave last (the fifth field of /proc/loadavg): processes born after it have
    greater pids, until the numbers wrap at pid_max."""
    try:
        with open(os.path.join(proc_root, "loadavg"), encoding="ascii") as fh:
            return int(fh.read().split()[4])
    except (OSError, ValueError, IndexError):
        return None


def _grow_buffer(sock: _socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, _RCVBUF)
    with contextlib.suppress(OSError):
        sock.setsockopt(_socket.SOL_SOCKET, _SO_RCVBUFFORCE, _RCVBUF)


def wall_time(at_ns: int) -> float:
    """The kernel's monotonic timestamp as unix time."""
    return time.time() - (time.monotonic_ns() - at_ns) / 1e9


def probe() -> tuple[bool, str]:
    """Can this process listen? Opens a listener and waits (bounded) for the exit of a child it starts:
    outside the initial namespaces the kernel accepts the request and sends nothing."""
    try:
        listener = ProcEventListener.open()
    except ProcEventsUnavailable as err:
        return False, err.message
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        if _exit_seen(listener, pid):
            return True, "netlink CN_PROC: fork, exec and exit of every process, with exit status"
        return False, "the kernel sends no process events here (a container: not the initial pid namespace)"
    finally:
        listener.close()


def _exit_seen(listener: ProcEventListener, pid: int) -> bool:
    deadline = time.monotonic() + _PROBE_DEADLINE_S
    while (left := deadline - time.monotonic()) > 0:
        select.select([listener], [], [], left)
        if any(e.kind == "exit" and e.pid == pid for e in listener.read()):
            return True
    return False

"""Who owns an RLock a hung thread waits for: py-spy shows the lock as its type and address only (a
frame's local, with --locals), but CPython's RLock object keeps its owner in its own memory, and that is
read from /proc/PID/mem (osapi.procmem) right after the dump that named it: no other pause, no ptrace.

CPython's `_thread.RLock` (Modules/_threadmodule.c, 3.7 to 3.13 alike, default builds):
    PyObject_HEAD               refcount at +0, type at +8
    the lock                    +16 (a pointer; 3.13: a one-byte mutex)
    the owner's thread ident    +24 (unsigned long: threading.get_ident(), py-spy's thread_id)
    the count                   +32 (how many times the owner took it)
What is read is believed only when it holds together: the object's type is named "_thread.RLock" (its
type object's tp_name, at +24 of the type), the owner is 0 with a count of 0 or a non-zero ident with a
count of at least 1 and below MAX_COUNT. A free-threaded build (a longer object header) fails the type
check and reads as unknown. Costs three reads of at most 40 bytes per lock, the type's two once per
process.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.observations import Frame, LocalRLock, ThreadStack
from jobwarden.osapi.procmem import ProcessMemory

TYPE_NAME = b"_thread.RLock"
MAX_LOCKS = 64  # distinct locks read per process: a frame with hundreds of them is no deadlock's
MAX_COUNT = 1 << 20  # a count past this is no count: the memory read something else
_HEAD = struct.Struct("<qQQQQ")  # refcount, type, lock, owner, count
_TP_NAME_AT = 24  # PyTypeObject: refcount, type, ob_size, tp_name


def with_owners(pid: int, threads: Sequence[ThreadStack], proc: str = "/proc") -> tuple[ThreadStack, ...]:
    """The threads, each RLock their frames' locals name filled in with its owner and count, where the
    process's memory could be read and made sense; the rest left unread (owner None)."""
    addresses = sorted({r.address for t in threads for f in t.frames for r in f.rlocks})[:MAX_LOCKS]
    if not addresses:
        return tuple(threads)
    try:
        with ProcessMemory(pid, proc) as mem:
            states = _Reader(mem).read(addresses)
    except (ProcessGone, AccessDenied):
        return tuple(threads)
    return tuple(_filled(t, states) for t in threads)


class _Reader:
    def __init__(self, mem: ProcessMemory) -> None:
        self.mem = mem
        self.types: dict[int, bool] = {}  # type object -> it is the RLock type

    def read(self, addresses: Sequence[int]) -> dict[int, tuple[int, int]]:
        found = {}
        for address in addresses:
            state = self.one(address)
            if state is not None:
                found[address] = state
        return found

    def one(self, address: int) -> tuple[int, int] | None:
        raw = self.mem.read(address, _HEAD.size)
        if len(raw) < _HEAD.size:
            return None
        refcount, type_address, _, owner, count = _HEAD.unpack(raw)
        if refcount <= 0 or not self._is_rlock_type(type_address):
            return None
        if (owner == 0) != (count == 0) or count >= MAX_COUNT:
            return None
        return owner, count

    def _is_rlock_type(self, address: int) -> bool:
        if address not in self.types:
            raw = self.mem.read(address + _TP_NAME_AT, 8)
            name = self.mem.read(struct.unpack("<Q", raw)[0], len(TYPE_NAME) + 1) if len(raw) == 8 else b""
            self.types[address] = name == TYPE_NAME + b"\0"
        return self.types[address]


def _filled(thread: ThreadStack, states: dict[int, tuple[int, int]]) -> ThreadStack:
    if not any(f.rlocks for f in thread.frames):
        return thread
    frames = tuple(_frame(f, states) for f in thread.frames)
    return dataclasses.replace(thread, frames=frames)


def _frame(frame: Frame, states: dict[int, tuple[int, int]]) -> Frame:
    if not frame.rlocks:
        return frame
    rlocks = tuple(
        dataclasses.replace(r, owner=states[r.address][0], count=states[r.address][1])
        if r.address in states
        else r
        for r in frame.rlocks
    )
    return dataclasses.replace(frame, rlocks=rlocks)


def owned_by(rlock: LocalRLock, threads: Sequence[ThreadStack]) -> ThreadStack | None:
    """The thread of the dump that owns the lock, if one does."""
    if not rlock.owner:
        return None
    return next((t for t in threads if t.ident == rlock.owner), None)

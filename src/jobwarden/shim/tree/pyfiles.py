"""Keeping the run's `py/` folder small: what the Python hooks leave there for each process, pruned once the
process has ended.

Each Python process of the job writes its advert (`<pid>.json`) as it starts, and its faulthandler file
(`<pid>.stacks`) where memfd_create is refused (a memfd otherwise): one or two files per process, for ever,
12,871 files after 6,434 forks (and pid_max is 4,194,304 on many distributions). Both serve only a live
process (the advert says it may be sent the dump signal; the dump is read from the stacks file the moment
it is written, and a fatal signal's dump goes to stderr, the output log): the shim removes them once the
process they belong to has ended. It knows that
by identity, (pid, start time) from the advert, never by pid alone: a reused pid's new advert stays.

A rank's flight-recorder FIFO and last answers (`<pid>.fr.req`, `.fr.json`, `.fr.poll.json`) go with its
advert: they serve a live rank only.

What the diagnosis needs stays: uncaught exceptions (`<pid>.exc.json`) and fork records
(`<pid>.forks.jsonl`, each bounded by the hooks: a few records per fork site and a count), up to a cap of
each; past it, exceptions written after the first MAX_KEPT are removed (the first ones are the story, the
later ones mostly its fallout), and fork records whose parent and children have all ended (a child names
its fork in its own advert).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.regularfile import read_regular

ADVERT, STACKS, EXCEPTION, FORKS = ".json", ".stacks", ".exc.json", ".forks.jsonl"
RECORDER_FILES = (".fr.req", ".fr.json", ".fr.poll.json")  # a rank's recorder FIFO and answers: served live
MAX_KEPT = 1000  # exception records, and fork records of processes that ended, kept at most
_ADVERT_MAX_BYTES = 1 << 16
_FORKS_MAX_BYTES = 4 << 20  # the hooks keep a process's fork records under 1 MB


class PyFiles:
    def __init__(self, py_dir: Path, procfs: ProcFS) -> None:
        self.py_dir, self.procfs = py_dir, procfs

    def store_advert(self, payload: bytes) -> None:
        """Write an advert the hooks announced on the FIFO (shim.tree.sightings) to `<pid>.json`, where every
        reader looks, in the order announced: a later one (the fault signal withdrawn) replaces an earlier.
        The hooks announce instead of writing the file themselves: creating it costs ext4 an inode and a
        rename, 0.2 ms of every forked child. A withdrawal the process wrote itself (it does, at once,
        after announcing it) is never replaced by an advert of the same process that still offers the
        signal: the job's handler took it, for good."""
        try:
            advert = json.loads(payload) if len(payload) <= _ADVERT_MAX_BYTES else None
        except (ValueError, RecursionError):
            return
        pid = advert.get("pid") if isinstance(advert, dict) else None
        start = advert.get("start_time") if isinstance(advert, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(start, int):
            return
        assert isinstance(advert, dict)
        existing = self._read_advert(pid)
        if (
            existing is not None
            and existing.get("start_time") == start
            and existing.get("fault_withdrawn")
            and not advert.get("fault_withdrawn")
        ):
            return
        path = self.py_dir / f"{pid}{ADVERT}"
        tmp = self.py_dir / f"{pid}{ADVERT}.shim.tmp"  # never a name prune() reads as a pid's file
        with contextlib.suppress(OSError):  # a planted link (O_NOFOLLOW), a full disk: no advert, no dump
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, payload)
            finally:
                os.close(fd)
            os.replace(tmp, path)

    def prune(self, live: Mapping[int, int]) -> int:
        """Remove what belongs to ended processes; `live`: the tree's members, pid -> start time (others
        are asked of /proc). The number of files removed."""
        try:
            names = os.listdir(self.py_dir)
        except OSError:
            return 0
        by_kind: dict[str, list[int]] = {ADVERT: [], STACKS: [], EXCEPTION: [], FORKS: []}
        for name in names:
            for suffix in (EXCEPTION, FORKS, ADVERT, STACKS):  # the longer suffixes first: x.exc.json
                pid = name.removesuffix(suffix)
                if name.endswith(suffix) and pid.isascii() and pid.isdigit():
                    by_kind[suffix].append(int(pid))
                    break
        removed = self._adverts(by_kind[ADVERT], by_kind[STACKS], live)
        removed += self._over_cap(by_kind[EXCEPTION], EXCEPTION, lambda pid: False)
        if len(by_kind[FORKS]) <= MAX_KEPT:
            return removed
        children = self._forked_children(by_kind[ADVERT])
        return removed + self._over_cap(
            by_kind[FORKS], FORKS, lambda pid: self._fork_relevant(pid, live, children.get(pid, ()))
        )

    def _adverts(self, adverts: list[int], stacks: list[int], live: Mapping[int, int]) -> int:
        removed = 0
        advertised = set(adverts)
        for pid in adverts:
            start = self._advert_start(pid)
            if start is None or self._alive(pid, start, live):
                continue  # unreadable (still being written?) or its process runs: kept
            removed += self._remove(pid, ADVERT) + self._remove(pid, STACKS)
            removed += sum(self._remove(pid, suffix) for suffix in RECORDER_FILES)
        for pid in stacks:  # a stacks file whose advert was never written: gone with any process of its pid
            if pid not in advertised and pid not in live and not self._pid_exists(pid):
                removed += self._remove(pid, STACKS)
        return removed

    def _over_cap(self, pids: list[int], suffix: str, keep: Callable[[int], bool]) -> int:
        """Past MAX_KEPT files of a kind, the newest ones that `keep(pid)` does not hold on to."""
        if len(pids) <= MAX_KEPT:
            return 0
        by_age = sorted(pids, key=lambda pid: self._mtime(pid, suffix))
        removed = 0
        for pid in by_age[MAX_KEPT:]:
            if not keep(pid):
                removed += self._remove(pid, suffix)
        return removed

    def _fork_relevant(self, parent: int, live: Mapping[int, int], children: Iterable[int]) -> bool:
        """A fork record matters while its parent or a child forked there runs (a hung child of a fork)."""
        if parent in live or self._pid_exists(parent):
            return True
        forked = [*children, *self._children(parent)]
        return any(child in live or self._pid_exists(child) for child in forked)

    def _forked_children(self, adverts: list[int]) -> dict[int, list[int]]:
        """parent -> children, from the children's adverts (`forked`: the hooks put the link there, one
        per child, rather than in the parent's file)."""
        found: dict[int, list[int]] = {}
        for pid in adverts:
            advert = self._read_advert(pid)
            forked = advert.get("forked") if advert is not None else None
            parent = forked.get("parent_pid") if isinstance(forked, dict) else None
            if isinstance(parent, int):
                found.setdefault(parent, []).append(pid)
        return found

    def _children(self, parent: int) -> Iterable[int]:
        with contextlib.suppress(OSError):
            for line in read_regular(self.py_dir / f"{parent}{FORKS}", _FORKS_MAX_BYTES).splitlines():
                try:
                    entry = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                child = entry.get("child_pid") if isinstance(entry, dict) else None
                if isinstance(child, int):
                    yield child

    def _advert_start(self, pid: int) -> int | None:
        advert = self._read_advert(pid)
        start = advert.get("start_time") if advert is not None else None
        return start if isinstance(start, int) and advert is not None and advert.get("pid") == pid else None

    def _read_advert(self, pid: int) -> dict[str, object] | None:
        try:
            advert = json.loads(read_regular(self.py_dir / f"{pid}{ADVERT}", _ADVERT_MAX_BYTES))
        except (OSError, ValueError, RecursionError):
            return None
        return advert if isinstance(advert, dict) else None

    def _alive(self, pid: int, start: int, live: Mapping[int, int]) -> bool:
        if live.get(pid) == start:
            return True
        return self.procfs.identity_matches(pid, start)

    def _pid_exists(self, pid: int) -> bool:
        """Some process of that pid runs (not a zombie): maybe the one that wrote the file."""
        try:
            return self.procfs.stat(pid).state not in ("Z", "X")
        except (ProcessGone, AccessDenied):
            return False

    def _mtime(self, pid: int, suffix: str) -> float:
        try:
            return (self.py_dir / f"{pid}{suffix}").stat().st_mtime
        except OSError:
            return 0.0

    def _remove(self, pid: int, suffix: str) -> int:
        try:
            (self.py_dir / f"{pid}{suffix}").unlink()
        except OSError:
            return 0
        return 1

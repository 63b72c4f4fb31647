"""Reading files from a shared place: a group's records on a cluster file system, the home's `web.token`.
Nothing read there is trusted before its owner, type and size are checked; this is the one reader that
checks them, so every caller gets every check. And writing a small secret of our own there
(`write_private`), so that nobody else sees it, not even for a moment.

- A directory is opened once (`O_DIRECTORY`) and checked by `fstat` on that descriptor: a directory,
  owned by a trusted user (by default: us), not writable by others (who could swap what is inside it).
  What lies inside is opened relative to it (openat), never by path again, so a directory renamed or
  replaced after its check cannot redirect a read.
- Below the directory a caller names, nothing is followed: every open has `O_NOFOLLOW` (a link planted as
  `rank-0.jsonl` that points at `/dev/zero` or another user's file is refused, not read). The directory
  named itself may be reached through a link (`--group-dir` naming a link to scratch space), if that link
  is a trusted user's too, as `paths.ensure_private_dir` allows for the home.
- A file is opened with `O_NONBLOCK` (a FIFO planted as a record must not hang the open) and `O_NOCTTY`,
  then must be a regular file (`fstat`: not a FIFO, device, socket), of a trusted owner, not writable by
  others (unreadable by others too where it holds a secret), and no larger than the caller's cap; it is
  read to at most the cap, so a file that grows while read stops there.

Each refusal is `Refused`, an OSError (EPERM), whose message says what was wrong: callers that skip an
unreadable file skip a refused one the same way, and count it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from jobwarden.osapi.regularfile import read_at_most

MAX_ENTRIES = 100_000  # names listed from one directory: more is a flood, not a job's records
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(PermissionError):
    """A file or directory that failed a check. `str()` says which and why. `not_a_file`: what is there is
    no regular file at all (a link, FIFO, device, socket, directory): never read, and not ours to replace."""

    def __init__(self, path: Path | str, why: str, not_a_file: bool = False) -> None:
        super().__init__(errno.EPERM, f"refusing {path}: {why}")
        self.path, self.why, self.not_a_file = Path(path), why, not_a_file

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass(frozen=True)
class Trust:
    """Whose files are believed. `owners`: by default only the effective user, as the writers (which make
    every directory 0700 and every file 0600) leave them. `secret`: a file that others must not even read
    (a token)."""

    owners: frozenset[int] = field(default_factory=lambda: frozenset({os.geteuid()}))
    secret: bool = False


@dataclass(frozen=True)
class Lines:
    """A file's lines (without their newline), and how many were left out for being over the line cap."""

    lines: list[bytes]
    too_long: int = 0


class SharedDir:
    """An opened, checked directory; what is inside is read through it. Use as a context manager."""

    def __init__(self, fd: int, path: Path, trust: Trust) -> None:
        self.fd, self.path, self.trust = fd, path, trust

    @classmethod
    def open(cls, path: Path, trust: Trust | None = None) -> SharedDir:
        """The directory `path` names (a trusted user's link to it allowed); raises OSError, Refused."""
        trust = trust or Trust()
        link = os.lstat(path)
        if stat.S_ISLNK(link.st_mode):
            _check_owner(path, link, trust)
        fd = os.open(path, (_DIR_FLAGS & ~os.O_NOFOLLOW) if stat.S_ISLNK(link.st_mode) else _DIR_FLAGS)
        return cls._checked(fd, path, trust)

    @classmethod
    def _checked(cls, fd: int, path: Path, trust: Trust) -> SharedDir:
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                raise Refused(path, "not a directory")
            _check_owner(path, st, trust)
            if st.st_mode & 0o022:
                raise Refused(path, f"others may write to it (mode {stat.S_IMODE(st.st_mode):04o})")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path, trust)

    def subdir(self, name: str) -> SharedDir:
        """A directory inside this one, never through a link."""
        fd = self._open_at(name, _DIR_FLAGS)
        return self._checked(fd, self.path / name, self.trust)

    def names(self, limit: int = MAX_ENTRIES) -> list[str]:
        """The names inside, sorted; at most `limit` (the first in directory order)."""
        found: list[str] = []
        with os.scandir(self.fd) as entries:
            for entry in entries:
                if len(found) >= limit:
                    break
                found.append(entry.name)
        return sorted(found)

    def read_bytes(self, name: str, max_bytes: int) -> bytes:
        """A whole regular file of at most `max_bytes` bytes."""
        return _read_checked(self._open_at(name, _READ_FLAGS), self.path / name, max_bytes, self.trust)

    def read_lines(self, name: str, max_bytes: int, max_line: int) -> Lines:
        """The lines of a regular file (see read_bytes); a line over `max_line` bytes is left out and
        counted. A last line without its newline is kept: the caller decides whether it is torn."""
        data = self.read_bytes(name, max_bytes)
        lines, too_long = [], 0
        for line in data.split(b"\n"):
            if len(line) > max_line:
                too_long += 1
            elif line:
                lines.append(line)
        return Lines(lines, too_long)

    def _open_at(self, name: str, flags: int) -> int:
        try:
            return os.open(_component(name), flags, dir_fd=self.fd)
        except OSError as err:
            # O_NOFOLLOW met a link (ELOOP, open(2)); with O_DIRECTORY a link or a file is ENOTDIR; a
            # socket, or a device without its driver, does not open at all (ENXIO, ENODEV)
            if err.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.ENODEV):
                raise
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except OSError:
                raise err from None
            if stat.S_ISLNK(st.st_mode):
                raise Refused(self.path / name, "a symbolic link", not_a_file=True) from err
            if err.errno == errno.ENOTDIR:
                raise Refused(self.path / name, f"not a directory ({_kind(st.st_mode)})") from err
            raise Refused(
                self.path / name, f"not a regular file ({_kind(st.st_mode)})", not_a_file=True
            ) from err

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_file(path: Path, max_bytes: int, trust: Trust | None = None, *, check_folder: bool = True) -> bytes:
    """One file, in a checked directory (its parent): `read_file(home / "web.token", 4096,
    Trust(secret=True))`. Without `check_folder`, only the file itself is checked (a file a job names, in
    a folder of its choosing such as /tmp). Raises FileNotFoundError when it is not there, Refused when
    it fails a check."""
    trust = trust or Trust()
    if check_folder:
        with SharedDir.open(path.parent, trust) as parent:
            return parent.read_bytes(path.name, max_bytes)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Refused(path, "a symbolic link", not_a_file=True) from err
        raise
    return _read_checked(fd, path, max_bytes, trust)


def _read_checked(fd: int, path: Path, max_bytes: int, trust: Trust) -> bytes:
    """The file open on `fd` (closed here), after its checks: regular, a trusted owner's, closed to
    others, within the cap."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(path, f"not a regular file ({_kind(st.st_mode)})", not_a_file=True)
        _check_owner(path, st, trust)
        if st.st_mode & (0o077 if trust.secret else 0o022):
            who = "read or write" if trust.secret else "write"
            raise Refused(path, f"others may {who} it (mode {stat.S_IMODE(st.st_mode):04o})")
        if st.st_size > max_bytes:
            raise Refused(path, f"{st.st_size} bytes, over the {max_bytes} a file here may have")
        data = read_at_most(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise Refused(path, f"grew past the {max_bytes} bytes a file here may have while read")
    return data


def _check_owner(path: Path, st: os.stat_result, trust: Trust) -> None:
    if st.st_uid not in trust.owners:
        owners = ", ".join(str(uid) for uid in sorted(trust.owners))
        raise Refused(path, f"it belongs to uid {st.st_uid}, not to uid {owners}")


def _component(name: str) -> str:
    """A name inside the directory, never a path that leaves it."""
    if not name or "/" in name or name in (".", ".."):
        raise Refused(name, "not a name inside the directory")
    return name


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return what
    return f"mode {mode:o}"


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` by a 0600 file holding `data`, atomically: written under a random name in the same
    directory (O_EXCL | O_NOFOLLOW: no planted name is followed) and renamed over `path` (a link at
    `path` is replaced, its target never touched)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

"""A distributed job's shared records: one directory per group and attempt, on the file system every node
sees (docs/cluster.md, "Group records").

    <group dir>/attempt-<k>/group.json            written once, by the first shim (tmp + rename)
                            nodes/<host>.json     each node's shim: pid, version, boot id, clock
                            ranks/rank-<R>.jsonl  one writer (the shim of R's node), append-only JSON lines
                            ranks/node-<host>.jsonl   a node whose ranks are unknown
                            stacks/rank-<R>-<ts>.json the stacks of a hung rank (tmp + rename)

Each record is appended with open/append/close, so that a network file system's close-to-open consistency
publishes it; whole documents go through a temporary file and a rename. A reader skips a torn last line
(its writer died mid-append, or the file server has not shown the rest yet). The SQLite store never lives
here: WAL does not work over a network file system.

Every directory is made 0700 and every file 0600 (records hold command lines, output tails, stacks), and
nothing is written through a symlink: an existing directory must be ours (paths.ensure_private_dir), a file
is opened with O_NOFOLLOW, so a link planted in a shared group directory never redirects a write.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.errors import StoreError
from jobwarden.paths import GROUP_DIR_ENV, ensure_private_dir

FORMAT_VERSION = 1
RECORD_KINDS = ("started", "alive", "finding", "hung", "engine-signal", "stopping", "ended", "engine-state")


def group_root(home: Path, group: str, group_dir: str | None, environ: dict[str, str] | None = None) -> Path:
    """--group-dir, else $JOBWARDEN_GROUP_DIR, else the home's groups/<group> (the home is shared on a
    cluster; the database is not kept there when it is, see paths.database_path)."""
    env = os.environ if environ is None else environ
    chosen = group_dir or env.get(GROUP_DIR_ENV)
    return Path(chosen).absolute() if chosen else home / "groups" / group


def attempt_dir(root: Path, attempt: int) -> Path:
    return root / f"attempt-{attempt}"


def latest_attempt(root: Path) -> int | None:
    found = [_attempt_number(p.name) for p in _entries(root)]
    numbers = [n for n in found if n is not None]
    return max(numbers) if numbers else None


def rank_file(attempt_root: Path, rank: int | None, node: str) -> Path:
    return records_file(attempt_root, f"rank-{rank}" if rank is not None else f"node-{node}")


def records_file(attempt_root: Path, label: str) -> Path:
    """ranks/<label>.jsonl: rank-3, task-1 (a Slurm task), node-n2 (a node whose ranks are unknown)."""
    return attempt_root / "ranks" / f"{_safe(label)}.jsonl"


def append_record(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, opened, appended and closed: raises OSError (the caller decides it is not fatal)."""
    line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
    fd = _open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def write_document(path: Path, document: dict[str, Any], *, replace: bool = True) -> bool:
    """A whole JSON document through a temporary file and a rename; readers see all of it or none. With
    replace=False an existing file is kept (the first writer wins): False when it was there already."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a stale one (an earlier process of this pid), or a link planted under its name
    fd = _open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(document, indent=1, default=str))
    try:
        if replace:
            os.rename(tmp, path)
            return True
        try:
            os.link(tmp, path)  # atomic "create if absent": the first shim's group.json stays
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links (some FUSE, SMB): nearly as good
            if path.exists():
                return False
            os.rename(tmp, path)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _open_private(path: Path, flags: int) -> int:
    """Open (create) a file 0600 in private directories, made again if removed since they were checked."""
    _private_parents(path)
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        _CHECKED.clear()
        _private_parents(path)
        return os.open(path, flags, 0o600)


def _private_parents(path: Path) -> None:
    """The group's directory, the attempt's and the file's own (ranks/, nodes/, stacks/; group.json's is
    the attempt's), each 0700 and
    ours: raises OSError, as the writers expect of any write here."""
    attempt = path.parent if _attempt_number(path.parent.name) is not None else path.parent.parent
    for directory in (attempt.parent, attempt, path.parent):
        if directory in _CHECKED:
            continue  # once a process: 0700 and ours, nobody else can swap what is inside it
        try:
            ensure_private_dir(directory)
        except StoreError as err:
            raise PermissionError(errno.EACCES, err.message) from err
        _CHECKED.add(directory)


# the directories this process made sure of: on a network file system each check is round trips, and the
# end records are written inside the engine's kill budget
_CHECKED: set[Path] = set()


@dataclass
class RankLog:
    """The records of one file: a rank's, or a whole node's when its ranks are unknown."""

    name: str  # "rank-3" | "node-n2"
    records: list[dict[str, Any]] = field(default_factory=list)
    torn: int = 0  # lines that did not parse (a torn last line)


@dataclass
class GroupRecords:
    root: Path
    attempt: int
    group: dict[str, Any] | None
    nodes: dict[str, dict[str, Any]]
    ranks: list[RankLog]


def read_group(root: Path, attempt: int | None = None) -> GroupRecords | None:
    """The records of one attempt (default: the latest); None when the group has none."""
    if attempt is None:
        attempt = latest_attempt(root)
        if attempt is None:
            return None
    where = attempt_dir(root, attempt)
    if not where.is_dir():
        return None
    nodes = {p.stem: doc for p in _entries(where / "nodes") if (doc := read_document(p)) is not None}
    ranks = [read_rank_log(p) for p in _entries(where / "ranks") if p.suffix == ".jsonl"]
    return GroupRecords(root, attempt, read_document(where / "group.json"), nodes, ranks)


def read_rank_log(path: Path) -> RankLog:
    log = RankLog(path.stem)
    try:
        data = path.read_bytes()
    except OSError:
        return log
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            log.torn += 1
            continue
        if isinstance(record, dict):
            log.records.append(record)
    return log


def read_document(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _entries(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


def _attempt_number(name: str) -> int | None:
    prefix, _, number = name.partition("-")
    return int(number) if prefix == "attempt" and number.isdecimal() else None


def _safe(text: str) -> str:
    """A host name as one path component."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "unknown"


def node_file(attempt_root: Path, node: str) -> Path:
    return attempt_root / "nodes" / f"{_safe(node)}.json"


def stacks_file(attempt_root: Path, label: str, at: float) -> Path:
    return attempt_root / "stacks" / f"{_safe(label)}-{int(at * 1000)}.json"

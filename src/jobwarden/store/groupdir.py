"""A distributed job's shared records: one directory per group and attempt, on the file system every node
sees (docs/cluster.md, "Group records").

    <group dir>/attempt-<k>/group.json            written once, by the first shim (tmp + rename)
                            nodes/<host>.json     each node's shim: pid, version, boot id, clock
                            ranks/rank-<R>.jsonl  one writer (the shim of R's node), append-only JSON lines
                            ranks/node-<host>.jsonl   a node whose ranks are unknown
                            stacks/rank-<R>-<ts>.json the stacks of a hung rank (tmp + rename)
                            rankviews/<host>.json each node's ranks over its last window (tmp + rename,
                                                  every few seconds: rules.speed.acrossnodes)

Each record is appended with open/append/close, so that a network file system's close-to-open consistency
publishes it; whole documents go through a temporary file and a rename. A reader skips a torn last line
(its writer died mid-append, or the file server has not shown the rest yet). The SQLite store never lives
here: WAL does not work over a network file system.

Every directory is made 0700 and every file 0600 (records hold command lines, output tails, stacks), and
nothing is written through a symlink: an existing directory must be ours (paths.ensure_private_dir), a file
is opened with O_NOFOLLOW, so a link planted in a shared group directory never redirects a write.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.errors import StoreError
from jobwarden.osapi.sharedfiles import Refused, SharedDir, read_file
from jobwarden.paths import GROUP_DIR_ENV, ensure_private_dir
from jobwarden.store.groupschema import GROUP_DOCUMENT
from jobwarden.store.groupschema import parse as parse_record

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
    bad: int = 0  # lines that parsed but are no record (a field of the wrong type), or over the line cap


@dataclass
class GroupRecords:
    root: Path
    attempt: int
    group: dict[str, Any] | None
    nodes: dict[str, dict[str, Any]]
    ranks: list[RankLog]
    refused: list[str] = field(default_factory=list)  # files and folders left out, each with why
    rank_views: list[dict[str, Any]] = field(default_factory=list)  # each node's rankviews/<host>.json

    @property
    def bad_records(self) -> int:
        return sum(log.bad for log in self.ranks)


# What one group may make a reader hold (osapi.sharedfiles reads no more): a rank writes a few hundred
# bytes a minute, and an end record with its output tail (20 lines of at most TAIL_LINE_CHARS) stays far
# under the line cap
MAX_RECORDS_FILE = 64 << 20
MAX_RECORD_LINE = 1 << 20
MAX_DOCUMENT = 1 << 20
MAX_RANK_VIEWS = 256 << 10  # one node's rank views: a shim's 16 ranks are some 10 KB
MAX_RANK_VIEW_NODES = 4_096  # nodes whose rank views are read
MAX_ATTEMPT_DIGITS = 9
MAX_RECORDS_PER_FILE = 5_000  # records of one rank kept (its newest), `alive` apart
MAX_GROUP_RECORDS = 100_000  # records of one attempt kept in memory: some 150 MB
TAIL_LINE_CHARS = 4096  # what a writer keeps of one line of output in a record


def read_group(root: Path, attempt: int | None = None) -> GroupRecords | None:
    """The records of one attempt (default: the latest); None when the group has none. Every directory
    and file is checked first (osapi.sharedfiles): the group's and the attempt's directories must be ours
    and closed to others, or this raises `Refused`; a file or folder inside that fails a check, and each
    record that is not one, is left out and counted."""
    try:
        top = SharedDir.open(root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with top:
        if attempt is None:
            attempt = _latest(top)
            if attempt is None:
                return None
        try:
            where = top.subdir(f"attempt-{attempt}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        with where:
            return _read_attempt(root, attempt, where)


def _read_attempt(root: Path, attempt: int, where: SharedDir) -> GroupRecords:
    refused: list[str] = []
    group = _document(where, "group.json", refused, GROUP_DOCUMENT)
    nodes: dict[str, dict[str, Any]] = {}
    with _subdir(where, "nodes", refused) as node_dir:
        for name in _visible(node_dir):
            doc = _document(node_dir, name, refused) if node_dir and name.endswith(".json") else None
            if doc is not None:
                nodes[name[: -len(".json")]] = doc
    ranks: list[RankLog] = []
    held = 0
    with _subdir(where, "ranks", refused) as rank_dir:
        for name in _visible(rank_dir):
            if not rank_dir or not name.endswith(".jsonl"):
                continue
            if held >= MAX_GROUP_RECORDS:
                refused.append(
                    f"{rank_dir.path / name}: past the {MAX_GROUP_RECORDS} records a group may hold"
                )
                continue
            log = _rank_log(rank_dir, name, refused)
            if log is not None:
                ranks.append(log)
                held += len(log.records)
    views: list[dict[str, Any]] = []
    with _subdir(where, "rankviews", refused) as view_dir:
        for name in _visible(view_dir)[:MAX_RANK_VIEW_NODES]:
            if view_dir and name.endswith(".json"):
                doc = _document(view_dir, name, refused, {}, MAX_RANK_VIEWS)
                views.extend([doc] if doc is not None else [])
    return GroupRecords(root, attempt, group, nodes, ranks, refused, views)


def _rank_log(directory: SharedDir, name: str, refused: list[str]) -> RankLog | None:
    try:
        read = directory.read_lines(name, MAX_RECORDS_FILE, MAX_RECORD_LINE)
    except FileNotFoundError:
        return None
    except OSError as err:
        refused.append(_why(directory, name, err))
        return None
    log = RankLog(name[: -len(".jsonl")], bad=read.too_long)
    # only the newest `alive` matters (rules.group: when a rank last spoke; one a minute, for weeks), and
    # of the rest the newest MAX_RECORDS_PER_FILE (a rank's story starts at its last `started`)
    kept: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(maxlen=MAX_RECORDS_PER_FILE)
    alive: tuple[int, dict[str, Any]] | None = None
    for i, line in enumerate(read.lines):
        record = parse_record(line)
        if record is None:
            torn = _torn(line)
            log.torn += torn
            log.bad += not torn
        elif record.get("kind") == "alive":
            alive = (i, record)
        else:
            kept.append((i, record))
    ordered = sorted([*kept, *([alive] if alive else [])], key=lambda pair: pair[0])
    log.records = [record for _, record in ordered]
    return log


def read_rank_log(path: Path) -> RankLog:
    """One records file on its own (its folder checked as read_group checks it)."""
    with SharedDir.open(path.parent) as directory:
        return _rank_log(directory, path.name, []) or RankLog(path.stem)


def _torn(line: bytes) -> bool:
    """A line that is not JSON at all (its writer died mid-append, or the rest has not arrived), as
    opposed to JSON that is no record (nested past the parser's depth, or of the wrong types)."""
    try:
        json.loads(line)
    except ValueError:
        return True
    except RecursionError:
        return False
    return False


def _why(directory: SharedDir, name: str, err: OSError) -> str:
    if isinstance(err, Refused):
        return f"{err.path}: {err.why}"
    return f"{directory.path / name}: {err.strerror or err}"


def read_document(path: Path) -> dict[str, Any] | None:
    """A JSON object from a regular file of ours of at most MAX_DOCUMENT bytes, wherever it is (the
    torchelastic error file a rank names, in a folder of its choosing): never through a link, never a
    FIFO or a device (osapi.sharedfiles). None when it is missing, refused or no object."""
    try:
        data = read_file(path, MAX_DOCUMENT, check_folder=False)
    except OSError:
        return None
    return parse_record(data, {})


def _document(
    directory: SharedDir,
    name: str,
    refused: list[str],
    fields: dict[str, Any] | None = None,
    limit: int = MAX_DOCUMENT,
) -> dict[str, Any] | None:
    try:
        data = directory.read_bytes(name, limit)
    except FileNotFoundError:
        return None
    except OSError as err:
        refused.append(_why(directory, name, err))
        return None
    doc = parse_record(data, fields if fields is not None else {})
    if doc is None:
        refused.append(f"{directory.path / name}: not a record jobwarden wrote")
    return doc


@contextlib.contextmanager
def _subdir(directory: SharedDir, name: str, refused: list[str]) -> Iterator[SharedDir | None]:
    try:
        sub = directory.subdir(name)
    except FileNotFoundError:
        yield None
        return
    except OSError as err:
        refused.append(_why(directory, name, err))
        yield None
        return
    with sub:
        yield sub


def _visible(directory: SharedDir | None) -> list[str]:
    """The names a reader looks at: not hidden (a writer's temporary file is)."""
    if directory is None:
        return []
    try:
        return [n for n in directory.names() if not n.startswith(".")]
    except OSError:
        return []


def _latest(top: SharedDir) -> int | None:
    """The largest attempt number whose directory passes the checks."""
    try:
        names = top.names()
    except OSError:
        return None
    numbers = sorted((n for name in names if (n := _attempt_number(name)) is not None), reverse=True)
    for number in numbers:
        try:
            top.subdir(f"attempt-{number}").close()
        except OSError:
            continue  # another user's, a link, a file: never the latest attempt
        return number
    return None


def _attempt_number(name: str) -> int | None:
    """attempt-3 -> 3; None for any other name, and for digits past what an attempt count can be."""
    prefix, _, number = name.partition("-")
    digits = number.isascii() and number.isdigit() and len(number) <= MAX_ATTEMPT_DIGITS
    return int(number) if prefix == "attempt" and digits else None


def _safe(text: str) -> str:
    """A host name as one path component."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "unknown"


def node_file(attempt_root: Path, node: str) -> Path:
    return attempt_root / "nodes" / f"{_safe(node)}.json"


def rank_views_file(attempt_root: Path, node: str) -> Path:
    return attempt_root / "rankviews" / f"{_safe(node)}.json"


def stacks_file(attempt_root: Path, label: str, at: float) -> Path:
    return attempt_root / "stacks" / f"{_safe(label)}-{int(at * 1000)}.json"

"""Reading a hung job's Python source for what its stacks cannot say (probes.withlocks, probes.feeds):
the file as the job's own user could read it, checked like any shared file, and not changed since the
process started; and the scopes of its `ast` (never run) that a frame's line falls in.
"""

from __future__ import annotations

import ast
import os
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.sharedfiles import Trust, read_file

MAX_SOURCE_BYTES = 256 << 10  # parsing costs ~0.2 s a 256 KiB file on a loaded machine (measurements.md)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def scope_of(tree: ast.Module, functions: list[ast.FunctionDef | ast.AsyncFunctionDef], line: int) -> ast.AST:
    """The innermost function (or the module) whose text holds the line. `functions` are in ast.walk's
    breadth-first order, and functions' lines nest, so the last one found is the innermost. (A lambda is
    no frame's scope here: it holds no `with`, and one on the line would hide the function around it.)"""
    scope: ast.AST = tree
    for node in functions:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            scope = node
    return scope


def own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a scope, not those of the functions and classes defined in it."""
    found: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return found


def locals_of(scope: ast.AST) -> set[str]:
    """The names a function binds for itself: its parameters and what it assigns (not `global` ones)."""
    names: set[str] = set()
    declared: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = scope.args
        names.update(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
        names.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
    for node in own_nodes(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names - declared


def started_at(procfs: ProcFS, pid: int) -> float | None:
    """When the process started, in seconds since the epoch."""
    try:
        return procfs.wall_time_of(procfs.stat(pid).start_time)
    except (ProcessGone, AccessDenied, OSError, ValueError):
        return None


def source_of(path: Path, started: float, users: set[int]) -> bytes | None:
    """The file's text, when it passes the shared-file checks (a regular file of ours, root's or the
    process's user's, not writable by others, within the cap), every process that runs it could read it
    itself (the shim may be root: a job naming /etc/shadow in its stack learns nothing from it), and it
    was not changed after the process started (a second of slack: the boot time is to the second)."""
    try:
        st = os.stat(path)
        if st.st_mtime > started + 1.0 or not all(may_read(st, uid) for uid in users):
            return None
        owners = frozenset({os.geteuid(), 0, *users})
        return read_file(path, MAX_SOURCE_BYTES, Trust(owners), check_folder=False)
    except OSError:
        return None


def may_read(st: os.stat_result, uid: int) -> bool:
    """Whether a process of `uid` may read the file, by its mode (groups aside: a group's file is read
    only when others may read it too, the safe side)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    return bool(st.st_mode & stat.S_IROTH)


def uid_of(procfs: ProcFS, pid: int) -> int | None:
    try:
        return procfs.uid(pid)
    except (ProcessGone, AccessDenied):
        return None


class _Site(Protocol):
    @property
    def line(self) -> int: ...


S = TypeVar("S", bound=_Site)


class WantedLines:
    """The lines the probes want read of each source file, with what source_of needs to trust it: the
    latest start of a process that runs it, and the users of those processes."""

    def __init__(self) -> None:
        self.lines: dict[str, set[int]] = {}
        self.started: dict[str, float] = {}
        self.users: dict[str, set[int]] = {}

    def add(self, file: str, line: int, started: float, uid: int) -> None:
        self.lines.setdefault(file, set()).add(line)
        self.started[file] = max(self.started.get(file, 0.0), started)
        self.users.setdefault(file, set()).add(uid)

    def sites(
        self, max_files: int, deadline: float, find: Callable[[bytes, str, set[int]], Iterable[S]]
    ) -> dict[tuple[str, int], S]:
        """What `find` says of each file's wanted lines, by (file, line): `max_files` files at most,
        until the monotonic `deadline`."""
        found: dict[tuple[str, int], S] = {}
        for file in sorted(self.lines)[:max_files]:
            if time.monotonic() > deadline:
                break
            source = source_of(Path(file), self.started[file], self.users[file])
            if source is not None:
                for site in find(source, file, self.lines[file]):
                    found[(file, site.line)] = site
        return found

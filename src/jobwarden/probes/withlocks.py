"""Which Python locks a hung thread holds and which it waits for, where the source says so: py-spy gives
each frame's file and line, never the lock object, so the source file is read and its `with` statements
around that line are looked at (`ast`, never run).

A lock is recognised only when it is unambiguous from the text: a name the file assigns once, at module
level, to `threading.Lock()` / `threading.RLock()` (or `Lock()` / `RLock()`), never rebound, and not a
local of the function the frame is in. `with self._lock:` (whose object?), a lock passed as an argument,
or one held after `acquire()` (until some later `release()`) are left out (a lone `NAME.acquire()` line
does say which lock a thread idle there waits for): a cycle drawn from them
could be wrong. A file changed after the process started is not read (its lines may no longer be the
ones running), nor one that fails the shared-file checks (owner, type, size).

Only asked when the run is judged hung, for the idle threads of processes with two or more of them, and
bounded: MAX_FILES files of at most MAX_SOURCE_BYTES, within BUDGET_S.
"""

from __future__ import annotations

import ast
import os
import stat
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.observations import HeldLock, LockSite, ProcessStack
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.sharedfiles import Trust, read_file

MAX_FILES = 8
MAX_SOURCE_BYTES = 256 << 10  # parsing costs ~0.2 s a 256 KiB file on a loaded machine (measurements.md)
BUDGET_S = 0.5
_LOCK_CALLS = {"Lock", "RLock"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def lock_sites(
    stacks: Sequence[ProcessStack], procfs: ProcFS | None = None
) -> dict[tuple[str, int], LockSite]:
    """The `with` locks at each line of the idle threads' Python frames, for processes with at least two
    idle threads (one thread alone cannot wait for another's lock)."""
    procfs = procfs or ProcFS()
    deadline = time.monotonic() + BUDGET_S
    wanted: dict[str, set[int]] = {}
    started: dict[str, float] = {}  # each file's latest start among the processes that run it
    users: dict[str, set[int]] = {}  # the users of the processes that run it
    for ps in stacks:
        idle = [t for t in ps.threads if t.active is False]
        if len(idle) < 2:
            continue
        start = _started_at(procfs, ps.pid)
        uid = _uid(procfs, ps.pid)
        if start is None or uid is None:
            continue
        for thread in idle:
            for frame in thread.frames:
                if not frame.native and frame.line and frame.file.startswith("/"):
                    wanted.setdefault(frame.file, set()).add(frame.line)
                    started[frame.file] = max(started.get(frame.file, 0.0), start)
                    users.setdefault(frame.file, set()).add(uid)
    found: dict[tuple[str, int], LockSite] = {}
    for file in sorted(wanted)[:MAX_FILES]:
        if time.monotonic() > deadline:
            break
        source = _source(Path(file), started[file], users[file])
        if source is not None:
            for site in sites_in(source, file, wanted[file]):
                found[(file, site.line)] = site
    return found


def sites_in(source: bytes, file: str, lines: Iterable[int]) -> list[LockSite]:
    """The LockSite of each line of `source` (a file's text) that takes or is held by a module-level lock:
    taken by a `with` whose header is the line or by a lone `NAME.acquire()` on it, held by the `with`
    blocks around it."""
    if b"Lock(" not in source:  # most files of a stack create no lock: not parsed
        return []
    try:
        tree = ast.parse(source, file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    locks = _module_locks(tree)
    if not locks:
        return []
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for line in sorted(set(lines)):
        scope = _scope_of(tree, functions, line)
        local = _locals(scope) if not isinstance(scope, ast.Module) else set()
        takes, holds = _acquire_on(scope, line, locks, local), []
        for node in _own_withs(scope):
            named = [_lock(item.context_expr, locks, local) for item in node.items]
            if node.lineno <= line < node.body[0].lineno:  # the header: the statement that waits to enter
                only = [n for n in named if n is not None]
                if len(only) == 1 and len(named) == 1:  # `with a, b:` stopped here: which one waits?
                    takes = HeldLock(only[0], locks[only[0]], node.lineno)
            elif node.body[0].lineno <= line <= (node.end_lineno or node.lineno):
                holds += [HeldLock(n, locks[n], node.lineno) for n in named if n is not None]
        if takes is not None or holds:
            found.append(LockSite(file, line, takes, tuple(sorted(holds, key=lambda h: h.with_line))))
    return found


def _acquire_on(scope: ast.AST, line: int, locks: dict[str, int], local: set[str]) -> HeldLock | None:
    """A statement `NAME.acquire()` (blocking, no timeout) alone on the line: a thread idle there waits
    to take that lock. (What it holds after is unknown: its `release()` may be anywhere.)"""
    for node in _own_nodes(scope):
        if isinstance(node, ast.Expr) and node.lineno == line and (node.end_lineno or line) == line:
            call = node.value
            if (
                isinstance(call, ast.Call)
                and not call.args
                and not call.keywords
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "acquire"
            ):
                name = _lock(call.func.value, locks, local)
                if name is not None:
                    return HeldLock(name, locks[name], line)
    return None


def _module_locks(tree: ast.Module) -> dict[str, int]:
    """Names assigned exactly once in the whole file, at module level, to a Lock() or RLock() call, and
    never declared `global` by a function (which could rebind them): name -> its line."""
    assigned: dict[str, list[ast.AST]] = {}
    rebindable: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            assigned.setdefault(node.id, []).append(node)
        elif isinstance(node, ast.Global):
            rebindable.update(node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                assigned.setdefault((alias.asname or alias.name).split(".")[0], []).append(node)
    found = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if _is_lock_call(stmt.value) and len(assigned.get(name, ())) == 1 and name not in rebindable:
                found[name] = stmt.lineno
    return found


def _is_lock_call(value: ast.expr) -> bool:
    if not isinstance(value, ast.Call) or value.args or value.keywords:
        return False
    func = value.func
    if isinstance(func, ast.Name):
        return func.id in _LOCK_CALLS
    return (
        isinstance(func, ast.Attribute)
        and func.attr in _LOCK_CALLS
        and isinstance(func.value, ast.Name)
        and func.value.id == "threading"
    )


def _scope_of(
    tree: ast.Module, functions: list[ast.FunctionDef | ast.AsyncFunctionDef], line: int
) -> ast.AST:
    """The innermost function (or the module) whose text holds the line. `functions` are in ast.walk's
    breadth-first order, and functions' lines nest, so the last one found is the innermost. (A lambda is
    no frame's scope here: it holds no `with`, and one on the line would hide the function around it.)"""
    scope: ast.AST = tree
    for node in functions:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            scope = node
    return scope


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a scope, not those of the functions and classes defined in it."""
    found: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _own_withs(scope: ast.AST) -> list[ast.With]:
    return [n for n in _own_nodes(scope) if isinstance(n, ast.With) and n.body]


def _locals(scope: ast.AST) -> set[str]:
    """The names a function binds for itself: its parameters and what it assigns (not `global` ones)."""
    names: set[str] = set()
    declared: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = scope.args
        names.update(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
        names.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
    for node in _own_nodes(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names - declared


def _lock(expr: ast.expr, locks: dict[str, int], local: set[str]) -> str | None:
    if isinstance(expr, ast.Name) and expr.id in locks and expr.id not in local:
        return expr.id
    return None


def _started_at(procfs: ProcFS, pid: int) -> float | None:
    """When the process started, in seconds since the epoch."""
    try:
        return procfs.wall_time_of(procfs.stat(pid).start_time)
    except (ProcessGone, AccessDenied, OSError, ValueError):
        return None


def _source(path: Path, started: float, users: set[int]) -> bytes | None:
    """The file's text, when it passes the shared-file checks (a regular file of ours, root's or the
    process's user's, not writable by others, within the cap), every process that runs it could read it
    itself (the shim may be root: a job naming /etc/shadow in its stack learns nothing from it), and it
    was not changed after the process started (a second of slack: the boot time is to the second)."""
    try:
        st = os.stat(path)
        if st.st_mtime > started + 1.0 or not all(_may_read(st, uid) for uid in users):
            return None
        owners = frozenset({os.geteuid(), 0, *users})
        return read_file(path, MAX_SOURCE_BYTES, Trust(owners), check_folder=False)
    except OSError:
        return None


def _may_read(st: os.stat_result, uid: int) -> bool:
    """Whether a process of `uid` may read the file, by its mode (groups aside: a group's file is read
    only when others may read it too, the safe side)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    return bool(st.st_mode & stat.S_IROTH)


def _uid(procfs: ProcFS, pid: int) -> int | None:
    try:
        return procfs.uid(pid)
    except (ProcessGone, AccessDenied):
        return None

"""Which Python locks a hung thread holds and which it waits for, where the source says so: py-spy gives
each frame's file and line, never the lock object, so the source file is read and its `with` statements
around that line are looked at (`ast`, never run).

A lock is recognised only when it is unambiguous from the text: a name the file assigns once, at module
level, to `threading.Lock()` / `threading.RLock()` (or `Lock()` / `RLock()`), never rebound, and not a
local of the function the frame is in; or an attribute a class binds once to `self.NAME = Lock()`,
named as `self.NAME` in that class's own plain methods (HeldLock.attribute: the same lock only on the
same object, which the frames' `self` addresses tell: `wanting_owners` says which processes to dump again
for them). A lock passed as an argument, another class's attribute, or one held after `acquire()` (until
some later `release()`) are left out (a lone `NAME.acquire()` line does say which lock a thread idle
there waits for): a cycle drawn from them could be wrong. A lock a local name holds (a parameter, a
variable) is only named (LockSite.takes_local): which object it is, the dump's locals say, and who holds
it, the object's memory (probes.rlocks, for RLocks). A file changed after the process started is
not read (its lines may no longer be the ones running), nor one that fails the shared-file checks
(owner, type, size).

Only asked when the run is judged hung, for the idle threads of processes with two or more of them, and
bounded: MAX_FILES files of at most MAX_SOURCE_BYTES, within BUDGET_S.
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Iterable, Mapping, Sequence

from jobwarden.observations import HeldLock, LockSite, ProcessStack
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pysource import (
    WantedLines,
    locals_of,
    own_nodes,
    scope_of,
    started_at,
    uid_of,
)

MAX_FILES = 8
BUDGET_S = 0.5
_LOCK_CALLS = {"Lock", "RLock"}
_SETTERS = {"setattr", "delattr"}
# the standard library's and installed packages' files: a lock they take in a local (Condition.wait's
# waiter) is no reason to dump a process again
# a line that may take a lock a local name holds: `with lock:`, `lock.acquire()`
_TAKES_A_NAME = re.compile(rb"^[ \t]*(with[ \t]+[A-Za-z_]\w*[ \t]*:|[A-Za-z_]\w*\.acquire\(\))", re.M)
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d+\.\d+t?/")


def lock_sites(
    stacks: Sequence[ProcessStack], procfs: ProcFS | None = None
) -> dict[tuple[str, int], LockSite]:
    """The `with` locks at each line of the idle threads' Python frames, for processes with at least two
    idle threads (one thread alone cannot wait for another's lock)."""
    procfs = procfs or ProcFS()
    deadline = time.monotonic() + BUDGET_S
    wanted = WantedLines()
    for ps in stacks:
        idle = [t for t in ps.threads if t.active is False]
        if len(idle) < 2:
            continue
        start = started_at(procfs, ps.pid)
        uid = uid_of(procfs, ps.pid)
        if start is None or uid is None:
            continue
        for thread in idle:
            for frame in thread.frames:
                if not frame.native and frame.line and frame.file.startswith("/"):
                    wanted.add(frame.file, frame.line, start, uid)
    return wanted.sites(MAX_FILES, deadline, sites_in)


def wanting_owners(stacks: Sequence[ProcessStack], sites: Mapping[tuple[str, int], LockSite]) -> list[int]:
    """The processes where an idle thread waits to enter an instance's lock (`with self._lock:`) that
    another idle thread's frames hold by the same name in the same file: whether it is the same lock
    depends on the objects, which only a dump with each frame's `self` tells (its frames' owners unread);
    and those where an idle thread of the job's own code waits at a `with NAME:` of a local name: which
    lock that is, and its owner where it is an RLock, only a dump with the locals tells (probes.rlocks)."""
    found = []
    for ps in stacks:
        waits: set[tuple[int, str, str]] = set()  # (thread, file, lock name)
        holds: set[tuple[int, str, str]] = set()
        locals_wanted = False
        for n, thread in enumerate(t for t in ps.threads if t.active is False):
            py = [f for f in thread.frames if not f.native and f.line]
            inner = sites.get((py[0].file, py[0].line or 0)) if py else None
            takes = inner.takes if inner is not None else None
            if takes is not None and takes.attribute and py[0].owner is None:
                waits.add((n, py[0].file, takes.name))
            if inner is not None and inner.takes_local and not _LIBRARY.search(py[0].file):
                locals_wanted = True  # which lock, and its owner, only the locals and the memory tell
            for frame in py[1:] if py else ():
                site = sites.get((frame.file, frame.line or 0))
                holds.update((n, frame.file, h.name) for h in (site.holds if site else ()) if h.attribute)
        if locals_wanted or any(w[1:] == h[1:] and w[0] != h[0] for w in waits for h in holds):
            found.append(ps.pid)
    return found


def sites_in(source: bytes, file: str, lines: Iterable[int]) -> list[LockSite]:
    """The LockSite of each line of `source` (a file's text) that takes or is held by a module-level lock:
    taken by a `with` whose header is the line or by a lone `NAME.acquire()` on it, held by the `with`
    blocks around it."""
    # most files of a stack create no lock and take none by a plain name: not parsed
    if b"Lock(" not in source and not _TAKES_A_NAME.search(source):
        return []
    try:
        tree = ast.parse(source, file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    locks = _Locks(tree)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for line in sorted(set(lines)):
        scope = scope_of(tree, functions, line)
        local = locals_of(scope) if not isinstance(scope, ast.Module) else set()
        takes, holds = _acquire_on(scope, line, locks, local), []
        for node in _own_withs(scope):
            named = [locks.named(item.context_expr, scope, local, node.lineno) for item in node.items]
            if node.lineno <= line < node.body[0].lineno:  # the header: the statement that waits to enter
                only = [n for n in named if n is not None]
                if len(only) == 1 and len(named) == 1:  # `with a, b:` stopped here: which one waits?
                    takes = only[0]
            elif node.body[0].lineno <= line <= (node.end_lineno or node.lineno):
                holds += [n for n in named if n is not None]
        taken = _local_taken(scope, line, local) if takes is None else ""
        if takes is not None or holds or taken:
            held = tuple(sorted(holds, key=lambda h: h.with_line))
            found.append(LockSite(file, line, takes, held, taken))
    return found


def _local_taken(scope: ast.AST, line: int, local: set[str]) -> str:
    """The local name (a parameter or a variable of the function) that a one-item `with NAME:` whose
    header is the line, or a lone blocking `NAME.acquire()` on it, takes: "" when none."""
    if not local:
        return ""
    for node in own_nodes(scope):
        if isinstance(node, ast.With) and node.body and node.lineno <= line < node.body[0].lineno:
            if len(node.items) == 1 and isinstance(node.items[0].context_expr, ast.Name):
                name = node.items[0].context_expr.id
                return name if name in local else ""
        elif isinstance(node, ast.Expr) and node.lineno == line == (node.end_lineno or line):
            call = node.value
            if (
                isinstance(call, ast.Call)
                and not call.args
                and not call.keywords
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "acquire"
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in local
            ):
                return call.func.value.id
    return ""


class _Locks:
    """The locks of one file a `with` can be tied to: module-level names (`_module_locks`), and attributes
    of `self` a class binds once (`_attribute_locks`), named in that class's own methods."""

    def __init__(self, tree: ast.Module) -> None:
        self.module = _module_locks(tree)
        self.attributes = _attribute_locks(tree)
        self.methods = dict(_methods(tree))

    def named(self, expr: ast.expr, scope: ast.AST, local: set[str], line: int) -> HeldLock | None:
        if isinstance(expr, ast.Name) and expr.id in self.module and expr.id not in local:
            return HeldLock(expr.id, self.module[expr.id], line)
        if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)):
            return None
        made = self.attributes.get(expr.attr)
        method = self.methods.get(scope)
        if made is None or method is None or made[0] is not method[0] or expr.value.id != method[1]:
            return None
        if any(
            isinstance(n, ast.Name) and n.id == method[1] and not isinstance(n.ctx, ast.Load)
            for n in own_nodes(scope)
        ):
            return None  # `self` rebound in the method: which object?
        return HeldLock(f"{method[1]}.{expr.attr}", made[1], line, attribute=True)


def _methods(tree: ast.Module) -> list[tuple[ast.AST, tuple[ast.ClassDef, str]]]:
    """Each plain method (no decorator: not a static or class method) of each class, with its class and
    the name of its first parameter (`self`)."""
    found: list[tuple[ast.AST, tuple[ast.ClassDef, str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.decorator_list:
                    params = [*item.args.posonlyargs, *item.args.args]
                    if params:
                        found.append((item, (node, params[0].arg)))
    return found


def _attribute_locks(tree: ast.Module) -> dict[str, tuple[ast.ClassDef, int]]:
    """Attributes bound exactly once in the whole file, as `self.NAME = threading.Lock()` (or RLock) in
    a plain method of a class, and never otherwise (no other `x.NAME = ...`, `del x.NAME`, or setattr
    with that name; any setattr/delattr with a name the text does not show hides them all): name -> its
    class and line."""
    stores: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            stores[node.attr] = stores.get(node.attr, 0) + 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SETTERS:
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                return {}
            stores[name.value] = stores.get(name.value, 0) + 2
    found = {}
    for method, (cls, me) in _methods(tree):
        for node in own_nodes(method):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.targets[0].value, ast.Name)
                and node.targets[0].value.id == me
                and _is_lock_call(node.value)
                and stores.get(node.targets[0].attr) == 1
            ):
                found[node.targets[0].attr] = (cls, node.lineno)
    return found


def _acquire_on(scope: ast.AST, line: int, locks: _Locks, local: set[str]) -> HeldLock | None:
    """A statement `NAME.acquire()` (blocking, no timeout) alone on the line: a thread idle there waits
    to take that lock. (What it holds after is unknown: its `release()` may be anywhere.)"""
    for node in own_nodes(scope):
        if isinstance(node, ast.Expr) and node.lineno == line and (node.end_lineno or line) == line:
            call = node.value
            if (
                isinstance(call, ast.Call)
                and not call.args
                and not call.keywords
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "acquire"
            ):
                return locks.named(call.func.value, scope, local, line)
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


def _own_withs(scope: ast.AST) -> list[ast.With]:
    return [n for n in own_nodes(scope) if isinstance(n, ast.With) and n.body]

"""Which queue, event or condition a hung thread waits on, and whose code would feed it: py-spy shows a
thread in `Queue.get` or `Event.wait`, never the object, so the source line that called it is read
(`ast`, never run), and so is every place of the file that puts into it, sets it or notifies it.

An object is recognised only where the text leaves no doubt: a name bound once (at module level, or in
one function) to `queue.Queue()` (and its kinds), `threading.Event()` / `Condition()`, or
multiprocessing's `Queue` / `Event` / `Condition` (also through `get_context()` or torch.multiprocessing);
the wait has no timeout. Its feeders are the functions whose code calls its `put` / `set` / `notify`,
also through a parameter when the object is handed to a `Thread` or `Process` as `args=`. Any other use
of the name (passed to some other call, stored elsewhere, returned) hides who else may feed it: the
feeders are then unknown (None), and no rule concludes from them. Each feeder says where the source
starts it as a thread's or a process's `target=`, and whether it is referenced nowhere else.

Same limits as probes.withlocks (the file's checks, MAX_FILES files, BUDGET_S), only when hung, only for
idle threads whose innermost Python frames are the standard library's waits.
"""

from __future__ import annotations

import ast
import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobwarden.observations import Feeder, FeedSite, FeedStart, Frame, ProcessStack
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.feedimports import Load, module_file, named_elsewhere
from jobwarden.probes.feedstarts import Starts
from jobwarden.probes.pysource import WantedLines, locals_of, own_nodes, source_of, started_at, uid_of

MAX_FILES = 8
BUDGET_S = 0.5
MAX_FEEDERS = 16  # functions feeding one object, past which they are not listed (each costs a walk)
# where a thread waiting on one of these objects sits: the frames between the wait and the job's call
WAITING_FILES = (
    "/threading.py",
    "/queue.py",
    "/multiprocessing/queues.py",
    "/multiprocessing/synchronize.py",
    "/multiprocessing/connection.py",
)
# what a module's constructor makes: (kind, across)
_MAKERS = {
    "queue.Queue": ("queue", "threads"),
    "queue.LifoQueue": ("queue", "threads"),
    "queue.PriorityQueue": ("queue", "threads"),
    "queue.SimpleQueue": ("queue", "threads"),
    "threading.Event": ("event", "threads"),
    "threading.Condition": ("condition", "threads"),
    "multiprocessing.Queue": ("queue", "processes"),
    "multiprocessing.JoinableQueue": ("queue", "processes"),
    "multiprocessing.SimpleQueue": ("queue", "processes"),
    "multiprocessing.Event": ("event", "processes"),
    "multiprocessing.Condition": ("condition", "processes"),
}
_WAITS = {"queue": {"get"}, "event": {"wait"}, "condition": {"wait", "wait_for"}}
_FEEDS = {"queue": {"put", "put_nowait"}, "event": {"set"}, "condition": {"notify", "notify_all"}}
# methods that neither feed the object nor hand it to anyone
_OTHER_METHODS = {
    "get",
    "get_nowait",
    "qsize",
    "empty",
    "full",
    "task_done",
    "join",
    "close",
    "join_thread",
    "cancel_join_thread",
    "clear",
    "is_set",
    "wait",
    "wait_for",
    "acquire",
    "release",
}
_Function = ast.FunctionDef | ast.AsyncFunctionDef


def feed_sites(
    stacks: Sequence[ProcessStack], procfs: ProcFS | None = None
) -> dict[tuple[str, int], FeedSite]:
    """The queue, event or condition each idle thread waits on, by the (file, line) of the job's call."""
    procfs = procfs or ProcFS()
    deadline = time.monotonic() + BUDGET_S
    wanted = WantedLines()
    for ps in stacks:
        calls = [c for c in (waiting_call(t.frames) for t in ps.threads if t.active is False) if c]
        start, uid = (started_at(procfs, ps.pid), uid_of(procfs, ps.pid)) if calls else (None, None)
        if start is None or uid is None:
            continue
        for call in calls:
            wanted.add(call.file, call.line or 0, start, uid)

    def find(source: bytes, file: str, lines: set[int]) -> list[FeedSite]:
        # another module of the job, read as the processes that run this file could
        return sites_in(
            source, file, lines, lambda path: source_of(Path(path), wanted.started[file], wanted.users[file])
        )

    return wanted.sites(MAX_FILES, deadline, find)


def waiting_call(frames: Sequence[Frame]) -> Frame | None:
    """The job's frame that called a standard library wait: the first Python frame outside WAITING_FILES,
    when the innermost Python frame is in one of them."""
    py = [f for f in frames if not f.native and f.line]
    if not py or not py[0].file.endswith(WAITING_FILES):
        return None
    caller = next((f for f in py if not f.file.endswith(WAITING_FILES)), None)
    return caller if caller is not None and caller.file.startswith("/") else None


def sites_in(source: bytes, file: str, lines: Iterable[int], load: Load | None = None) -> list[FeedSite]:
    """The FeedSite of each of `lines` that waits on an object the file makes and names, or imports by
    name from a module beside it (`load` reads that module, as the process could)."""
    # a file that neither makes such an object nor imports names from a module of its own is not parsed
    if not any(word in source for word in (b"Queue", b"Event", b"Condition")) and (
        load is None or b"from " not in source
    ):
        return []
    try:
        tree = ast.parse(source, file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found = []
    try:
        reader = _Reader(tree, file, load)
        for line in sorted(set(lines)):
            site = reader.site(file, line)
            if site is not None:
                found.append(site)
    except RecursionError:  # names bound to each other's calls in a loop the text never ends
        return found
    return found


@dataclass(frozen=True)
class _Object:
    home: ast.AST  # the module, or the function that makes it; an attribute's: its class
    name: str  # "results"; an attribute's as the waiting line names it: "self.q"
    kind: str
    across: str
    defined: int
    attribute: str = ""  # "q" for `self.q`, bound once in its class's `__init__`
    origin: _Reader | None = None  # the module that makes it, read for it (probes.feedimports)
    local: str = ""  # then: the name the importing file gives it


class _Reader:
    """One parsed file: its imports, the objects it makes, who feeds each."""

    def __init__(self, tree: ast.Module, file: str = "", load: Load | None = None) -> None:
        self.tree, self.file, self.load = tree, file, load
        # one walk of the file for every index below: a feeder looked up must not walk it again
        self.nodes: list[ast.AST] = [tree]
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in self.nodes:  # grows as it goes: breadth first
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self.nodes.append(child)
        self.functions = [n for n in self.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.modules = _imports(self.nodes)
        self.stores = _stores(self.nodes)
        self.rebindable = {name for n in self.nodes if isinstance(n, ast.Global) for name in n.names}
        self.named: dict[str, list[ast.Name]] = {}  # every Name node by its id
        for node in self.nodes:
            if isinstance(node, ast.Name):
                self.named.setdefault(node.id, []).append(node)
        self.starts = Starts(self.nodes, self.parents, self.functions, self._dotted)
        self.attributes: dict[str, list[ast.Attribute]] = {}  # every attribute node by its name
        for node in self.nodes:
            if isinstance(node, ast.Attribute):
                self.attributes.setdefault(node.attr, []).append(node)
        self.local_names: dict[ast.AST, set[str]] = {}
        # a setattr/delattr anywhere may bind any attribute: none is known to be bound once
        self.setattrs = any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr")
            for n in self.nodes
        )

    # --- the waiting line -------------------------------------------------------------------------

    def site(self, file: str, line: int) -> FeedSite | None:
        waits = [c for c in self._calls_on(line) if _untimed(c)]
        if len(waits) != 1:  # none, or two on one line (which one waits?)
            return None
        call = waits[0]
        assert isinstance(call.func, ast.Attribute)
        found = self._resolve_expr(call.func.value, call)
        if found is None:
            return None
        if call.func.attr not in _WAITS[found.kind]:
            return None
        if found.origin is not None:
            feeders = self._imported_feeders(found, found.origin)
            return FeedSite(
                file, line, found.local, found.kind, found.across, found.defined, feeders, found.origin.file
            )
        return FeedSite(file, line, found.name, found.kind, found.across, found.defined, self._feeders(found))

    def _imported(self, name: str) -> _Object | None:
        """The object a module-level `from jobqueue import work_queue` binds `name` to, where that module
        is beside this file and makes it."""
        if self.load is None or len(self.stores.get(name, ())) != 1 or name in self.rebindable:
            return None
        for stmt in self.tree.body:
            if not isinstance(stmt, ast.ImportFrom):
                continue
            alias = next((a for a in stmt.names if (a.asname or a.name) == name), None)
            if alias is None:
                continue
            found = module_file(self.file, stmt.module, stmt.level, self.load)
            if found is None:
                return None
            try:
                other = _Reader(ast.parse(found[1], found[0]), found[0])
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return None
            obj = other._object(other.tree, alias.name)
            return dataclasses.replace(obj, origin=other, local=name) if obj is not None else None
        return None

    def _imported_feeders(self, obj: _Object, origin: _Reader) -> tuple[Feeder, ...] | None:
        """The feeders in the module that makes it and in this file, unless a file beside them names it."""
        assert self.load is not None
        theirs = origin._feeders(dataclasses.replace(obj, origin=None, local=""))
        ours = self._feeders(_Object(self.tree, obj.local, obj.kind, obj.across, obj.defined))
        if theirs is None or ours is None or len(theirs) + len(ours) > MAX_FEEDERS:
            return None
        for name in {obj.name, obj.local}:
            if named_elsewhere(name, (self.file, origin.file), self.load):
                return None
        return (*ours, *(dataclasses.replace(f, file=origin.file) for f in theirs))

    def _calls_on(self, line: int) -> list[ast.Call]:
        return [
            n
            for n in self.nodes
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and _named(n.func.value)
            and n.func.attr in {"get", "wait", "wait_for"}
            and n.lineno <= line <= (n.end_lineno or n.lineno)
        ]

    def _resolve_expr(self, expr: ast.expr, node: ast.AST, depth: int = 0) -> _Object | None:
        """The object a name (`results`) or an attribute of a method's `self` (`self.q`) is."""
        if isinstance(expr, ast.Name):
            return self._resolve(expr.id, node, depth)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            return self._attribute(expr, node)
        return None

    def _attribute(self, expr: ast.Attribute, node: ast.AST) -> _Object | None:
        """`self.q` in a plain method of a class whose `__init__` binds `self.q = queue.Queue()`, the
        file's only binding of an attribute of that name (nor any setattr)."""
        assert isinstance(expr.value, ast.Name)
        cls = self.starts.class_of_self(expr.value, node)
        stores = [a for a in self.attributes.get(expr.attr, ()) if not isinstance(a.ctx, ast.Load)]
        if cls is None or len(stores) != 1 or self.setattrs:
            return None
        assign = self.parents.get(stores[0])
        init = self.parents.get(assign) if isinstance(assign, ast.Assign) else None
        if not (
            isinstance(assign, ast.Assign)
            and len(assign.targets) == 1
            and isinstance(init, ast.FunctionDef)
            and init.name == "__init__"
            and isinstance(stores[0].value, ast.Name)
            and self.starts.class_of_self(stores[0].value, assign) is cls
            and isinstance(assign.value, ast.Call)
        ):
            return None
        made = _MAKERS.get(self._dotted(assign.value.func) or "")
        if made is None:
            return None
        return _Object(cls, f"{expr.value.id}.{expr.attr}", made[0], made[1], assign.lineno, expr.attr)

    def _resolve(self, name: str, node: ast.AST, depth: int = 0) -> _Object | None:
        """The object a name at `node` is: the first scope outward that binds the name decides (its own
        object, or a parameter a thread's or process's start hands it as)."""
        for scope in self._scopes_around(node):
            if isinstance(scope, ast.Module) or name in self._locals(scope):
                obj = self._object(scope, name)
                if obj is None and isinstance(scope, ast.Module):
                    return self._imported(name)
                if obj is None and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and depth < 3:
                    return self._handed(scope, name, depth + 1)
                return obj
        return None

    def _scopes_around(self, node: ast.AST) -> Iterator[ast.AST]:
        at: ast.AST | None = node
        while at is not None:
            # a class body is no scope its methods see
            if isinstance(at, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
                yield at
            at = self.parents.get(at)

    def _object(self, scope: ast.AST, name: str) -> _Object | None:
        """The object `name` is bound to in `scope`, when that is its only binding."""
        if isinstance(scope, ast.Module):
            if len(self.stores.get(name, ())) != 1 or name in self.rebindable:
                return None
        elif sum(1 for n in self._names_in(scope, name) if not isinstance(n.ctx, ast.Load)) != 1:
            return None
        for node in own_nodes(scope):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name
                and isinstance(node.value, ast.Call)
            ):
                made = _MAKERS.get(self._dotted(node.value.func) or "")
                if made is not None:
                    return _Object(scope, name, made[0], made[1], node.lineno)
        return None

    def _handed(self, function: _Function, param: str, depth: int) -> _Object | None:
        """The object a function's parameter is, when every start of the function as a target hands it
        the same one in that place of `args=`."""
        params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
        if param not in params or self._rebinds(function, param):
            return None
        handed = set()
        for start, kind in self.starts.of(function):
            run = self.starts.target(start, kind)
            args = self.starts.handed(start, kind)
            index = params.index(param) - (run[1] if run else 0)
            if run is None or run[0] is not function or args is None or not 0 <= index < len(args):
                return None
            found = self._resolve_expr(args[index], start, depth)
            if found is None:
                return None
            handed.add(found)
        return handed.pop() if len(handed) == 1 else None

    # --- who feeds it -----------------------------------------------------------------------------

    def _feeders(self, obj: _Object) -> tuple[Feeder, ...] | None:
        """Every function that feeds the object, or None when some use of it hides that."""
        feeds: dict[ast.AST, int] = {}  # the function (or the module) -> its first line that feeds
        # (scope, name) still to follow: the object's own name, or a parameter it is handed as
        todo: list[tuple[ast.AST, str]] = [] if obj.attribute else [(obj.home, obj.name)]
        uses = self._attribute_uses(obj) if obj.attribute else []
        done: set[tuple[int, str]] = set()
        while uses is not None:
            for use, inner in uses:
                how = self._use(use, obj)
                if how is None:
                    return None
                if isinstance(how, tuple):
                    todo.append(how)
                elif how > 0:
                    feeds[inner] = min(feeds.get(inner, how), how)
            todo = [t for t in todo if (id(t[0]), t[1]) not in done]
            if not todo:
                break
            scope, name = todo.pop()
            done.add((id(scope), name))
            uses = list(self._uses(scope, name))
        if uses is None:
            return None
        if len(feeds) > MAX_FEEDERS:
            return None
        found = []
        for function, line in feeds.items():
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return None  # fed by module-level code or a lambda: which thread runs it is not said
            starts = tuple(self._start(call, kind) for call, kind in self.starts.of(function))
            only = self.starts.only_started(
                function, self.named.get(function.name, []), self.attributes.get(function.name, [])
            )
            found.append(
                Feeder(
                    function.name, function.lineno, function.end_lineno or function.lineno, line, starts, only
                )
            )
        return tuple(sorted(found, key=lambda f: f.first))

    def _attribute_uses(self, obj: _Object) -> list[tuple[ast.expr, ast.AST]] | None:
        """Each load of the attribute, with the method it is in: all on a method's `self` of its class,
        else None (another object's `.q` may be this one)."""
        found: list[tuple[ast.expr, ast.AST]] = []
        for node in self.attributes.get(obj.attribute, ()):
            if not isinstance(node.ctx, ast.Load):
                continue
            cls = self.starts.class_of_self(node.value, node) if isinstance(node.value, ast.Name) else None
            if cls is not obj.home:
                return None
            method: ast.AST | None = node
            while method is not None and not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                method = self.parents.get(method)
            assert method is not None  # class_of_self found it
            found.append((node, method))
        return found

    def _use(self, use: ast.expr, obj: _Object) -> int | tuple[ast.AST, str] | None:
        """One load of the object's name: the line it feeds it at, 0 for a harmless use, (function,
        parameter) where it is handed to a thread's or process's target, None where it escapes."""
        parent = self.parents.get(use)
        if isinstance(parent, ast.Attribute) and parent.value is use:
            call = self.parents.get(parent)
            if not isinstance(call, ast.Call) or call.func is not parent:
                return None
            if parent.attr in _FEEDS[obj.kind]:
                return call.lineno
            return 0 if parent.attr in _OTHER_METHODS else None
        if isinstance(parent, ast.withitem) and parent.context_expr is use and obj.kind == "condition":
            return 0
        if isinstance(parent, (ast.Tuple, ast.List)):
            keyword = self.parents.get(parent)
            start = self.parents.get(keyword) if isinstance(keyword, ast.keyword) else None
            if isinstance(keyword, ast.keyword) and keyword.arg == "args" and isinstance(start, ast.Call):
                kind = self.starts.starter(start)
                return self._handed_to(start, kind, parent.elts.index(use)) if kind else None
        if isinstance(parent, ast.Call) and use in parent.args[1:] and self._submit(parent):
            return self._handed_to(parent, "task", parent.args.index(use) - 1)
        return None

    @staticmethod
    def _submit(call: ast.Call) -> bool:
        return isinstance(call.func, ast.Attribute) and call.func.attr == "submit"

    def _handed_to(self, start: ast.Call, kind: str, index: int) -> tuple[ast.AST, str] | None:
        """The function and parameter a start hands its `index`th argument to."""
        run = self.starts.target(start, kind)
        if run is None:
            return None
        function, skipped = run
        params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]][skipped:]
        if index >= len(params) or self._rebinds(function, params[index]):
            return None
        return function, params[index]

    def _uses(self, scope: ast.AST, name: str) -> Iterator[tuple[ast.expr, ast.AST]]:
        """Each load of `name` in `scope` and in the functions nested in it that do not bind it
        themselves, with the innermost function (or class) it is in."""
        for node in self.named.get(name, ()):
            if not isinstance(node.ctx, ast.Load):
                continue
            inner: ast.AST | None = None
            at = self.parents.get(node)
            while at is not None and at is not scope:
                if isinstance(at, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    if name in self._locals(at):
                        break  # another variable of the same name
                    inner = inner or at
                elif isinstance(at, ast.ClassDef):
                    inner = inner or at
                at = self.parents.get(at)
            if at is scope:
                yield node, inner or scope

    def _locals(self, scope: ast.AST) -> set[str]:
        if scope not in self.local_names:
            self.local_names[scope] = locals_of(scope)
        return self.local_names[scope]

    def _names_in(self, scope: ast.AST, name: str) -> list[ast.Name]:
        return [n for n in own_nodes(scope) if isinstance(n, ast.Name) and n.id == name]

    def _rebinds(self, function: _Function, param: str) -> bool:
        return any(not isinstance(n.ctx, ast.Load) for n in self._names_in(function, param))

    # --- starts -----------------------------------------------------------------------------------

    def _start(self, call: ast.Call, kind: str) -> FeedStart:
        label = self.starts.label(call)
        scope = next(self._scopes_around(call))
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = (scope.name, scope.lineno, scope.end_lineno or scope.lineno)
        elif isinstance(scope, ast.Lambda):
            where = ("<lambda>", scope.lineno, scope.end_lineno or scope.lineno)
        else:
            where = ("<module>", 1, (self.tree.body[-1].end_lineno or 1) if self.tree.body else 1)
        return FeedStart(kind, call.lineno, label[:64], *where)

    def _dotted(self, expr: ast.expr, depth: int = 0) -> str | None:
        """'queue.Queue' for `queue.Queue`, `Queue` (from queue import Queue), `mp.Queue`, `ctx.Queue`
        (ctx = multiprocessing.get_context(...)), `torch.multiprocessing.Queue`."""
        if isinstance(expr, ast.Name):
            dotted = self.modules.get(expr.id)
        elif isinstance(expr, ast.Attribute):
            base = self._base(expr.value, depth)
            dotted = f"{base}.{expr.attr}" if base else None
        else:
            return None
        if dotted and dotted.startswith("torch.multiprocessing"):
            dotted = dotted[len("torch.") :]
        return dotted

    def _base(self, expr: ast.expr, depth: int = 0) -> str | None:
        if depth > 4:  # `a = b.get_context()`, `b = a.f()`: names defined by each other
            return None
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            outer = self.modules.get(expr.value.id)
            return f"{outer}.{expr.attr}" if outer else None
        if not isinstance(expr, ast.Name):
            return None
        if expr.id in self.modules:
            return self.modules[expr.id]
        # a context: bound once in the file to multiprocessing.get_context(...)
        if len(self.stores.get(expr.id, ())) == 1:
            value = self.stores[expr.id][0]
            if isinstance(value, ast.Call) and self._dotted(value.func, depth + 1) in (
                "multiprocessing.get_context",
                "torch.multiprocessing.get_context",
            ):
                return "multiprocessing"
        return None


def _named(expr: ast.expr) -> bool:
    """`results`, or `self.q`: what a wait's receiver may be for the object to be found."""
    return isinstance(expr, ast.Name) or (
        isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)
    )


def _imports(nodes: list[ast.AST]) -> dict[str, str]:
    """What each imported name is: {'mp': 'multiprocessing', 'Queue': 'queue.Queue'}."""
    found = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    found[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _stores(nodes: list[ast.AST]) -> dict[str, list[ast.AST | None]]:
    """Every binding of each name in the file, anywhere: the value of a plain `name = value`, else None."""
    found: dict[str, list[ast.AST | None]] = {}
    for node in nodes:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            found.setdefault(node.id, []).append(None)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found.setdefault((alias.asname or alias.name).split(".")[0], []).append(None)
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = found[node.targets[0].id]
            if len(values) == 1:
                values[0] = node.value
    return found


def _untimed(call: ast.Call) -> bool:
    """A wait with no timeout: `get()`, `get(True)`, `get(block=True)`, `wait()`, `wait_for(pred)`."""
    assert isinstance(call.func, ast.Attribute)
    if any(k.arg not in ("block",) for k in call.keywords):
        return False
    block = [*call.args[:1], *(k.value for k in call.keywords)] if call.func.attr == "get" else []
    if call.func.attr == "get":
        return len(call.args) <= 1 and all(isinstance(b, ast.Constant) and b.value is True for b in block)
    if call.func.attr == "wait_for":
        return len(call.args) == 1 and not call.keywords
    return not call.args and not call.keywords

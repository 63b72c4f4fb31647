"""Where a file starts a function on a thread, a process or an executor (probes.feeds): the code that feeds
a queue runs in what those starts started, and nowhere else when the function is named by nothing else.

Three ways the text can say it, each unambiguous:
- `threading.Thread(target=load, args=(q,))` (or multiprocessing's `Process`), and the bound method
  `target=self.load` in a method of the class that defines `load`;
- the `run` method of a class that derives from `threading.Thread` (or `Process`): each call of the class
  makes a thread that runs it;
- `pool.submit(load, q)` on an executor (ThreadPoolExecutor, ProcessPoolExecutor: any `.submit(`): a
  task, whose arguments are the function's.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

_STARTERS = {"threading.Thread": "thread", "multiprocessing.Process": "process"}
_Function = ast.FunctionDef | ast.AsyncFunctionDef
Start = tuple[ast.Call, str]  # the call that starts it, and "thread", "process" or "task"


class Starts:
    """The starts of one parsed file, found in one pass over its nodes."""

    def __init__(
        self,
        nodes: list[ast.AST],
        parents: dict[ast.AST, ast.AST],
        functions: list[_Function],
        dotted: Callable[[ast.expr], str | None],
    ) -> None:
        self.parents, self.functions, self.dotted = parents, functions, dotted
        self.targets: dict[str, list[Start]] = {}  # target=NAME
        self.bound: dict[tuple[int, str], list[Start]] = {}  # target=self.NAME, by (the class, NAME)
        self.submits: dict[str, list[Start]] = {}  # .submit(NAME, ...)
        self.bound_submits: dict[tuple[int, str], list[Start]] = {}  # .submit(self.NAME, ...)
        self.made: dict[str, list[ast.Call]] = {}  # calls of a plain name: a class made, by its name
        # the classes whose `run` the text names (`Loader().run()`, `self.run` in its methods): it may run
        # outside a thread there; None in the set: a `.run` of some other object, which may be any class
        self.run_named: set[str | None] = set()
        self.named_otherwise: set[str] = set()  # names loaded other than as a call's function
        for node in nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                parent = parents.get(node)
                if not (isinstance(parent, ast.Call) and parent.func is node):
                    self.named_otherwise.add(node.id)
            if isinstance(node, ast.Attribute) and node.attr == "run":
                self.run_named.add(self._receiver_class(node.value))
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name):
                self.made.setdefault(node.func.id, []).append(node)
            kind = self.starter(node)
            if kind is not None:
                target = next((k.value for k in node.keywords if k.arg == "target"), None)
                self._add(node, kind, target, self.targets, self.bound)
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "submit" and node.args:
                self._add(node, "task", node.args[0], self.submits, self.bound_submits)

    def _add(
        self,
        call: ast.Call,
        kind: str,
        target: ast.expr | None,
        plain: dict[str, list[Start]],
        bound: dict[tuple[int, str], list[Start]],
    ) -> None:
        if isinstance(target, ast.Name):
            plain.setdefault(target.id, []).append((call, kind))
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            cls = self.class_of_self(target.value, call)
            if cls is not None:
                bound.setdefault((id(cls), target.attr), []).append((call, kind))

    def starter(self, call: ast.Call) -> str | None:
        return _STARTERS.get(self.dotted(call.func) or "")

    def of(self, function: _Function) -> list[Start]:
        """Every start of the function: as a target, a task, or the thread a class of it makes."""
        cls = self._class(function)
        if cls is None:
            return [*self.targets.get(function.name, ()), *self.submits.get(function.name, ())]
        key = (id(cls), function.name)
        found = [*self.bound.get(key, ()), *self.bound_submits.get(key, ())]
        kind = self._runner(cls) if function.name == "run" else None
        if kind is not None:
            found += [(call, kind) for call in self.made.get(cls.name, ())]
        return found

    def only_started(
        self, function: _Function, named: list[ast.Name], attributes: list[ast.Attribute]
    ) -> bool:
        """The function is defined once and named nowhere but where it is started (`named`: every Name of
        its name in the file; `attributes`: every attribute of its name)."""
        cls = self._class(function)
        if cls is None:
            if sum(1 for f in self.functions if f.name == function.name) != 1:
                return False
            return all(self._in_start(node) for node in named)
        if sum(1 for f in self.functions if f.name == function.name and self._class(f) is cls) != 1:
            return False
        if function.name == "run" and self._runner(cls) is not None:
            # made only by calls the text shows (a class handed elsewhere may be made there), and its run
            # never called outside a thread
            return cls.name not in self.named_otherwise and not self.run_named & {None, cls.name}
        return bool(attributes) and all(self._in_start(node) for node in attributes)

    def handed(self, call: ast.Call, kind: str) -> list[ast.expr] | None:
        """What a start hands the function's parameters, in order (after `self` for a bound method):
        `args=` of a thread or process, the arguments after the function of a task; None when the text
        does not list them (a class made: its `__init__` takes them)."""
        if kind == "task":
            return list(call.args[1:]) if not any(isinstance(a, ast.Starred) for a in call.args) else None
        target = next((k.value for k in call.keywords if k.arg == "target"), None)
        if target is None:
            return None
        args = next((k.value for k in call.keywords if k.arg == "args"), None)
        if args is None:
            return []
        return list(args.elts) if isinstance(args, (ast.Tuple, ast.List)) else None

    def target(self, call: ast.Call, kind: str) -> tuple[_Function, int] | None:
        """The function a start runs, and how many of its first parameters the start does not hand (1
        for a bound method's `self`)."""
        expr = call.args[0] if kind == "task" and call.args else None
        if kind != "task":
            expr = next((k.value for k in call.keywords if k.arg == "target"), None)
        if isinstance(expr, ast.Name):
            named = [f for f in self.functions if f.name == expr.id and self._class(f) is None]
            return (named[0], 0) if len(named) == 1 else None
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            cls = self.class_of_self(expr.value, call)
            methods = [f for f in self.functions if f.name == expr.attr and self._class(f) is cls]
            return (methods[0], 1) if cls is not None and len(methods) == 1 else None
        return None

    def label(self, call: ast.Call) -> str:
        """The thread's `name=`, a plain string at the call, or, for a thread class made, the one its
        `__init__` hands `super().__init__(name=...)`; "" when the text does not say."""
        name = _name_given(call)
        if name or not isinstance(call.func, ast.Name):
            return name
        classes = [n for n in self.functions if n.name == "__init__" and self._named_class(n, call.func.id)]
        inits = [
            node
            for init in classes[:1]
            for node in ast.walk(init)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
        ]
        return _name_given(inits[0]) if len(inits) == 1 else ""

    def _named_class(self, function: ast.AST, name: str) -> bool:
        cls = self._class(function)
        return cls is not None and cls.name == name and self._runner(cls) is not None

    def class_of_self(self, name: ast.Name, at: ast.AST) -> ast.ClassDef | None:
        """The class whose plain method `at` is in, when `name` is that method's first parameter."""
        node: ast.AST | None = at
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = self.parents.get(node)
        if node is None or node.decorator_list:
            return None
        params = [*node.args.posonlyargs, *node.args.args]
        cls = self._class(node)
        return cls if cls is not None and params and params[0].arg == name.id else None

    def _receiver_class(self, expr: ast.expr) -> str | None:
        """The class an object is, where the text says: `Loader(...)`, a method's `self`."""
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            return expr.func.id
        cls = self.class_of_self(expr, expr) if isinstance(expr, ast.Name) else None
        return cls.name if cls is not None else None

    def _class(self, function: ast.AST) -> ast.ClassDef | None:
        parent = self.parents.get(function)
        return parent if isinstance(parent, ast.ClassDef) else None

    def _runner(self, cls: ast.ClassDef) -> str | None:
        """'thread' for a class that derives from threading.Thread itself, 'process' for Process."""
        return next((k for k in (_STARTERS.get(self.dotted(b) or "") for b in cls.bases) if k), None)

    def _in_start(self, node: ast.AST) -> bool:
        """The name is a start's `target=`, or the function a `.submit(` runs."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.keyword):
            call = self.parents.get(parent)
            return parent.arg == "target" and isinstance(call, ast.Call) and self.starter(call) is not None
        return (
            isinstance(parent, ast.Call)
            and isinstance(parent.func, ast.Attribute)
            and parent.func.attr == "submit"
            and bool(parent.args)
            and parent.args[0] is node
        )


def _name_given(call: ast.Call) -> str:
    name = next((k.value for k in call.keywords if k.arg == "name"), None)
    return name.value[:64] if isinstance(name, ast.Constant) and isinstance(name.value, str) else ""

"""The house's shape (issue 29), over the whole package: no module past 600 lines but the hooks' core (it
loads as one file in every Python process of a job, its parts on demand), and no class spread over files
by inheritance (the supervisor and the Store are compositions)."""

from __future__ import annotations

import ast
from pathlib import Path

import jobwarden

PACKAGE = Path(jobwarden.__file__).parent
HOOKS_CORE = PACKAGE / "hooks" / "site" / "_jobwarden_hooks.py"
MAX_LINES = 600


def test_no_module_is_past_600_lines_but_the_hooks_core() -> None:
    sizes = {path: len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    too_long = {str(p.relative_to(PACKAGE)): n for p, n in sizes.items() if n > MAX_LINES and p != HOOKS_CORE}
    assert too_long == {}


def test_no_class_is_spread_over_files_by_inheritance() -> None:
    """A class whose base is one of jobwarden's own, from another module, is read by walking files to find
    what a method does (the supervisor was three files so, the Store four mixins). Exceptions are the one
    kind that may: a JobwardenError subclass adds a name, not behaviour."""
    spread = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = _names_imported_from_jobwarden(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in imported]
                spread += [
                    f"{path.relative_to(PACKAGE)}: {node.name}({base})"
                    for base in bases
                    if not base.endswith(("Error", "Exception"))
                ]
    assert spread == []


def _names_imported_from_jobwarden(tree: ast.Module) -> set[str]:
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jobwarden")
        for alias in node.names
    }

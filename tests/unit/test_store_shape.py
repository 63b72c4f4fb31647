"""The store's shape (issue 29): `Store` is one class that delegates, each noun's SQL in its own module.

A reader who looks for what `store.update_run` does must find one body in one file: no mixin spreads
`Store` over files by inheritance, and `store/repo.py` holds no SQL of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jobwarden.store import repo
from jobwarden.store.repo import Store

STORE_DIR = Path(repo.__file__).parent
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b")


def test_the_store_inherits_nothing() -> None:
    assert Store.__bases__ == (object,)


def test_the_store_module_holds_no_sql() -> None:
    tree = ast.parse(Path(repo.__file__).read_text())
    found = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value)
    ]
    assert found == []


def test_no_module_of_the_store_is_past_600_lines() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in STORE_DIR.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}

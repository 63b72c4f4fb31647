"""A queue, an event or a condition another module of the job makes, imported by name into the file that
waits on it (`from jobqueue import work_queue`): probes.feeds reads that module too, for the object and
its feeders, beside the waiting file's own.

The module is looked for where the import names it relative to the waiting file (its directory for a
plain `from jobqueue import ...`, which Python searches first for the main script; the package for
`from .jobqueue import ...`), read with the same checks as the waiting file. Code elsewhere may feed the
object too: any other Python file beside either of the two that names it (or that cannot be read, or past
MAX_NEIGHBOURS) leaves its feeders unknown.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

MAX_NEIGHBOURS = 64  # Python files beside the two looked at for other uses of the name

Load = Callable[[str], bytes | None]  # a file's text as the waiting file's process could read it


def module_file(importer: str, module: str | None, level: int, load: Load) -> tuple[str, bytes] | None:
    """The file and text of the module an import in `importer` names, where it is beside it."""
    base = Path(importer).parent
    for _ in range(max(level - 1, 0)):
        base = base.parent
    parts = module.split(".") if module else []
    if not parts:
        return None
    for path in (base.joinpath(*parts[:-1], parts[-1] + ".py"), base.joinpath(*parts, "__init__.py")):
        source = load(str(path)) if path.is_file() else None
        if source is not None:
            return str(path), source
    return None


def named_elsewhere(name: str, files: tuple[str, ...], load: Load) -> bool:
    """Some other Python file in the directories of `files` names `name`, or could not be read."""
    word = name.encode()
    seen = 0
    for folder in dict.fromkeys(str(Path(f).parent) for f in files):
        try:
            entries = sorted(e.path for e in os.scandir(folder) if e.name.endswith(".py") and e.is_file())
        except OSError:
            return True
        for path in entries:
            if path in files:
                continue
            seen += 1
            source = load(path) if seen <= MAX_NEIGHBOURS else None
            if source is None or word in source:
                return True
    return False

"""Each rank of a running job as its shim last saw it (`status --json`'s `ranks`, DESIGN.md "Ranks"): a
small JSON file in the run's directory, replaced whole (write then rename: a reader never sees half of
it) every few seconds while the job has ranks. A file, not a table: it changes every few seconds, is read
only by the frontends of that one run, and means nothing once the run has ended."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

VERSION = 1


def write_ranks(path: Path, rows: list[dict[str, Any]], at: float) -> bool:
    """Replace the file; False when it could not be written (a full disk costs the view, nothing more)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"version": VERSION, "at": at, "ranks": rows}, separators=(",", ":")))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def read_ranks(path: Path) -> list[dict[str, Any]]:
    """The rows as last written; [] when there are none (no ranks, not yet, or unreadable)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    rows = found.get("ranks") if isinstance(found, dict) and found.get("version") == VERSION else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

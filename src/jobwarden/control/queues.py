"""The queues as `jobwarden queue` shows and sets them: how many runs each lets run at once, how many
hold a place and how many wait."""

from __future__ import annotations

from pathlib import Path

from jobwarden.store import Store
from jobwarden.store.queues import DEFAULT_PARALLEL, QueueInfo

__all__ = ["QueueInfo", "queues"]


def queues(home: Path, name: str | None = None, parallel: int | None = None) -> list[QueueInfo]:
    """Every queue (`name`: that one alone, as a queue nobody set when it is none yet), after setting
    `name`'s parallel count to `parallel` when one is given."""
    with Store(home) as store:
        if parallel is not None:
            assert name is not None
            store.set_queue_parallel(name, parallel)
        found = [q for q in store.queues() if name is None or q.name == name]
    if name is not None and not found:
        found = [QueueInfo(name, DEFAULT_PARALLEL, 0, 0)]
    return found

"""Waiting on file descriptors (pidfds, pipes) with a timeout: poll(2), never select (no FD_SETSIZE limit
on a 1000-process tree)."""

from __future__ import annotations

import select

_POLL_MAX_MS = (1 << 31) - 1  # poll(2) takes a C int of milliseconds: 24.8 days


def _readable(fds: list[int], timeout_s: float | None) -> set[int]:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    # a longer wait (stop --grace 25d) returns after 24.8 days as if timed out, rather than overflow
    timeout_ms = None if timeout_s is None else min(int(timeout_s * 1000), _POLL_MAX_MS)
    return {fd for fd, _ in poller.poll(timeout_ms)}


def wait_readable(fds: list[int], timeout_s: float | None) -> set[int]:
    """Block until one of `fds` is readable or the timeout (None: none) passes. poll, not select: no
    FD_SETSIZE limit on a 1000-process tree."""
    return _readable(fds, None if timeout_s is None else max(0.0, timeout_s))

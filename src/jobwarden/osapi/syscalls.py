"""System calls by number, per architecture (the kernel's unistd.h): what `/proc/PID/task/TID/syscall`
names, for the calls jobwarden reads a wait from (shim.watch.rankwatch: where a rank is; probes.waits: what a
hung thread waits for). Another architecture: none are named, and nothing is concluded from a call."""

from __future__ import annotations

import os

NAMES: dict[str, dict[int, str]] = {
    "x86_64": {
        0: "read",
        1: "write",
        7: "poll",
        17: "pread64",
        19: "readv",
        20: "writev",
        23: "select",
        35: "nanosleep",
        43: "accept",
        45: "recvfrom",
        47: "recvmsg",
        61: "wait4",
        72: "fcntl",
        73: "flock",
        74: "fsync",
        75: "fdatasync",
        202: "futex",
        219: "restart_syscall",
        230: "clock_nanosleep",
        232: "epoll_wait",
        247: "waitid",
        257: "openat",
        270: "pselect6",
        271: "ppoll",
        281: "epoll_pwait",
        288: "accept4",
        295: "preadv",
        327: "preadv2",
        441: "epoll_pwait2",
        449: "futex_waitv",
    },
    "aarch64": {
        22: "epoll_pwait",
        25: "fcntl",
        32: "flock",
        56: "openat",
        63: "read",
        64: "write",
        65: "readv",
        66: "writev",
        67: "pread64",
        69: "preadv",
        72: "pselect6",
        73: "ppoll",
        82: "fsync",
        83: "fdatasync",
        95: "waitid",
        98: "futex",
        101: "nanosleep",
        115: "clock_nanosleep",
        128: "restart_syscall",
        202: "accept",
        207: "recvfrom",
        212: "recvmsg",
        242: "accept4",
        260: "wait4",
        286: "preadv2",
        441: "epoll_pwait2",
        449: "futex_waitv",
    },
}


def names_here() -> dict[int, str]:
    """This machine's table (empty on another architecture)."""
    return NAMES.get(os.uname().machine, {})

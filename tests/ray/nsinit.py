"""The init (pid 1) of the Ray tests' namespaces, run by `unshare --net --pid --fork --mount-proc`: brings
the namespace's loopback up, says "up", then reaps whatever is handed to it (Ray's daemons, once `ray start`
exits) until its stdin closes. Then it exits, and the kernel kills every process left in the namespace:
nothing the Ray tests start can outlive them, even if pytest itself is killed.

Stdlib only, no jobwarden import: it runs before anything else in the namespace."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import struct
import sys

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    """`ip link set lo up` without iproute2: the interface flags through ioctl."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def main() -> None:
    loopback_up()
    sys.stdout.write("up\n")
    sys.stdout.flush()
    # Woken by the stdin closing; the timeout only paces the reaping of orphans handed to pid 1
    while not select.select([sys.stdin], [], [], 0.5)[0] or sys.stdin.buffer.read1(4096):
        reap()


if __name__ == "__main__":
    main()

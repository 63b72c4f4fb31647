"""What the kernel lets us do, found by trying it: ptrace attach (Yama, capabilities, containers) and
PIDFD_INFO_EXIT. Used by `jobwarden doctor`; each probe starts short-lived children and reaps them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
from dataclasses import dataclass
from pathlib import Path

from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.process import WaitStatus

CAP_SYS_PTRACE = 19  # include/uapi/linux/capability.h
_PR_SET_PTRACER = 0x59616D61  # "Yama": the tracee names a process allowed to attach (and its descendants)
_PTRACE_SEIZE = 0x4206  # attaches without stopping the tracee; the tracer's exit detaches it
_PROBE_TIMEOUT_S = 10.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


@dataclass(frozen=True)
class ProbeResult:
    """`ok` None: the probe itself could not run (say why in `detail`)."""

    ok: bool | None
    detail: str


def yama_ptrace_scope(proc_root: str = "/proc") -> int | None:
    """Yama's kernel.yama.ptrace_scope (0-3); None when the kernel has no Yama."""
    try:
        return int(Path(proc_root, "sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def has_capability(cap: int, proc_root: str = "/proc") -> bool:
    """Is `cap` in our effective set (/proc/self/status CapEff)?"""
    try:
        for line in Path(proc_root, "self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def probe_ptrace_attach() -> ProbeResult:
    """Can a child of ours attach to a sibling that declared us its tracer? This is exactly how py-spy,
    started by the supervisor, reaches a job process whose hooks called PR_SET_PTRACER(supervisor)."""
    parent = os.getpid()
    release_r, release_w = os.pipe()
    ready_r, ready_w = os.pipe()
    target = os.fork()
    if target == 0:  # the tracee: declare the parent as tracer (EINVAL without Yama: harmless), wait
        try:
            os.close(release_w)
            os.close(ready_r)
            _libc.prctl(_PR_SET_PTRACER, parent, 0, 0, 0)
            os.write(ready_w, b"1")
            os.read(release_r, 1)
        finally:
            os._exit(0)
    os.close(release_r)
    os.close(ready_w)
    try:
        if not select.select([ready_r], [], [], _PROBE_TIMEOUT_S)[0] or not os.read(ready_r, 1):
            return ProbeResult(None, "the probe's target process did not start")
        return _attach_from_child(target)
    finally:
        os.close(ready_r)
        os.close(release_w)  # the target reads EOF and exits
        os.waitpid(target, 0)


def _attach_from_child(target: int) -> ProbeResult:
    tracer = os.fork()
    if tracer == 0:
        code = 0
        try:
            if _libc.ptrace(_PTRACE_SEIZE, target, None, None) != 0:
                code = ctypes.get_errno() or 255
        finally:
            os._exit(code)  # exiting detaches the tracee
    _, raw = os.waitpid(tracer, 0)
    status = WaitStatus.decode(raw)
    if status.exit_code == 0:
        return ProbeResult(True, "attached")
    if status.exit_code is None:
        return ProbeResult(None, f"the probe's tracer died of {status.signal_name}")
    name = errno.errorcode.get(status.exit_code, str(status.exit_code))
    return ProbeResult(False, f"{name} ({os.strerror(status.exit_code)})")


def probe_pidfd_exit_info() -> ProbeResult:
    """Does PIDFD_INFO_EXIT work here? Open a pidfd of a child, let it exit 7, reap it, read the status."""
    release_r, release_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(release_w)
            os.read(release_r, 1)
        finally:
            os._exit(7)
    os.close(release_r)
    try:
        fd = pidfds.open_pidfd(child)
    except Exception as err:
        os.close(release_w)
        os.waitpid(child, 0)
        return ProbeResult(None, f"pidfd_open failed: {err}")
    try:
        os.close(release_w)
        os.waitpid(child, 0)  # PIDFD_INFO_EXIT reports a process once it has been reaped
        try:
            raw = pidfds.exit_status(fd)
        except OSError as err:
            return ProbeResult(False, f"PIDFD_GET_INFO failed: {err.strerror}")
        if raw is None:
            return ProbeResult(False, "the kernel does not report PIDFD_INFO_EXIT")
        status = WaitStatus.decode(raw)
        if status.exit_code != 7:
            return ProbeResult(False, f"it reported a wrong status ({raw:#x} for exit code 7)")
        return ProbeResult(True, "a reaped child's exit code was read back through its pidfd")
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """'6.18.0-1-amd64' -> (6, 18)."""
    text = os.uname().release if release is None else release
    parts = text.split(".")
    try:
        major = int(parts[0])
        minor = int(
            "".join(c for c in (parts[1] if len(parts) > 1 else "0").split("-")[0] if c.isdigit()) or 0
        )
    except ValueError:
        return (0, 0)
    return (major, minor)

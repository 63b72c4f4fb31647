"""gdb for processes py-spy cannot read (not Python): `thread apply all bt`, native frames only.

gdb attaches with PTRACE_ATTACH, which sends SIGSTOP. If gdb is killed at its deadline (an attach to a
thread in D state waits for ever), that SIGSTOP may stay pending and stop the whole process later, once
the thread wakes: the caller must then send SIGCONT, which discards a pending stop, unless the process
was already stopped on purpose before we came (then SIGCONT would wrongly resume it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from jobwarden.observations import Frame, ThreadStack
from jobwarden.osapi.process import which
from jobwarden.osapi.tool import ToolUnavailable, run_tool
from jobwarden.probes.stackbase import CaptureError, Failure

GDB_ENV = "JOBWARDEN_GDB"  # path to gdb; a path that does not exist disables it
METHOD = "gdb"


def find_gdb(environ: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    override = env.get(GDB_ENV)
    if override:
        path = Path(override)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = which("gdb", env.get("PATH") or os.environ.get("PATH") or os.defpath)
    return Path(found) if found else None


def dump(binary: Path, pid: int, timeout_s: float) -> str:
    """gdb's backtrace of every thread. Raises CaptureError."""
    argv = [
        str(binary),
        "-nx",  # no ~/.gdbinit: nothing of the user's may slow or change this
        "-batch",
        "-iex",
        "set debuginfod enabled off",  # never fetch symbols from the network mid-diagnosis
        "-iex",
        "set auto-load safe-path /nonexistent",
        "-p",
        str(pid),
        "-ex",
        "thread apply all bt",
    ]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TERM": "dumb"}
    try:
        result = run_tool(argv, timeout_s, env)
    except ToolUnavailable as err:
        raise CaptureError(Failure.UNAVAILABLE, err.message) from err
    out = result.stdout.decode("utf-8", "replace")
    err_text = result.stderr.decode("utf-8", "replace")
    if result.timed_out:
        raise CaptureError(Failure.TIMEOUT, f"gdb gave no answer within {timeout_s:.1f}s")
    if "ptrace: Operation not permitted" in err_text + out:
        raise CaptureError(Failure.DENIED, "gdb: ptrace permission denied")
    if "ptrace: No such process" in err_text + out:
        raise CaptureError(Failure.GONE, "the process exited during the dump")
    if not _THREAD.search(out) and not _FRAME_START.search(out):
        first = next((ln for ln in err_text.splitlines() if ln.strip()), "no output")
        raise CaptureError(Failure.FAILED, f"gdb printed no backtrace: {first[:200]}")
    return out


_THREAD = re.compile(r"^Thread \d+ \((?P<what>.*)\):$", re.MULTILINE)
_LWP = re.compile(r"\b(?:LWP|process) (\d+)")
_NAME = re.compile(r'"([^"]*)"\s*$')
_FRAME_START = re.compile(r"^#\d+\s+", re.MULTILINE)
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+ in ")
_AT = re.compile(r" at (\S+):(\d+)$")
_FROM = re.compile(r" from (\S+)$")


def parse_backtrace(text: str, states: Mapping[int, str] | None = None) -> tuple[ThreadStack, ...]:
    """gdb's `thread apply all bt` -> ThreadStacks (innermost first, every frame native).

        Thread 2 (Thread 0x7f... (LWP 812) "worker"):
        #0  0x00007f... in __futex_abstimed_wait_common64 (...) at ./nptl/futex-internal.c:57
        #1  0x00005636... in ?? ()
        #2  main () at x.c:3
        #3  0x00007f... in __libc_start_main () from /lib/x86_64-linux-gnu/libc.so.6

    A process gdb attached to without thread support prints frames with no Thread header: one thread."""
    states = states or {}
    threads: list[ThreadStack] = []
    tid: int | None = None
    name: str | None = None
    frames: list[Frame] = []
    started = False

    def close() -> None:
        if started:
            threads.append(ThreadStack(tid, name, tuple(frames), states.get(tid) if tid else None))

    for raw in text.splitlines():
        line = raw.rstrip()
        header = _THREAD.match(line)
        if header:
            close()
            lwp, label = _LWP.search(header.group("what")), _NAME.search(header.group("what"))
            tid = int(lwp.group(1)) if lwp else None
            name = label.group(1) if label else None
            frames, started = [], True
            continue
        if line.startswith("#"):
            frame = _parse_frame(line)
            if frame is not None:
                started = True
                frames.append(frame)
    close()
    return tuple(threads)


def _parse_frame(line: str) -> Frame | None:
    head = _FRAME_START.match(line)
    if head is None:
        return None
    rest = _ADDRESS.sub("", line[head.end() :])
    file, lineno = "", None
    at = _AT.search(rest)
    if at:
        file, lineno, rest = at.group(1), int(at.group(2)), rest[: at.start()]
    else:
        lib = _FROM.search(rest)
        if lib:
            file, rest = lib.group(1), rest[: lib.start()]
    function = rest.split(" (", 1)[0].strip() if not rest.startswith("<") else rest.strip()
    return Frame(function or "??", file, lineno, native=True)

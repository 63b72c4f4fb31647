"""py-spy: find the binary, run one `dump --json` on one process, turn its answer into ThreadStacks.

py-spy >= 0.4 pauses a process with PTRACE_SEIZE + PTRACE_INTERRUPT, which queue no signal: a dump that is
killed at its deadline leaves no stop pending in the target (unlike PTRACE_ATTACH tools), so no SIGCONT is
owed afterwards. `--nonblocking` reads memory without pausing at all: the mode for a process that must not
be paused (a thread in D state, or stopped by job control, where the blocking pause fails outright).
"""

from __future__ import annotations

import enum
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobwarden.observations import Frame, LocalRLock, ThreadStack
from jobwarden.osapi.process import which
from jobwarden.osapi.tool import ToolUnavailable, run_tool
from jobwarden.probes.stackbase import CaptureError, Failure

PY_SPY_ENV = "JOBWARDEN_PY_SPY"  # path to the py-spy binary; a path that does not exist disables it


class Mode(enum.Enum):
    """How py-spy reads a process; the value is what ProcessStack.method records."""

    BLOCKING = "py-spy"
    NATIVE = "py-spy --native"
    NONBLOCKING = "py-spy --nonblocking"

    @property
    def flags(self) -> tuple[str, ...]:
        return {Mode.BLOCKING: (), Mode.NATIVE: ("--native",), Mode.NONBLOCKING: ("--nonblocking",)}[self]


def find_py_spy(environ: Mapping[str, str] | None = None) -> Path | None:
    """JOBWARDEN_PY_SPY if set; else the py-spy installed beside this interpreter (the wheel puts it in
    the virtualenv's bin, which need not be on PATH); else the first on PATH."""
    env = os.environ if environ is None else environ
    override = env.get(PY_SPY_ENV)
    if override:
        return Path(override) if _executable(Path(override)) else None
    beside = Path(sys.executable).parent / "py-spy"
    if _executable(beside):
        return beside
    found = which("py-spy", env.get("PATH") or os.environ.get("PATH") or os.defpath)
    return Path(found) if found else None


def missing_message(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if env.get(PY_SPY_ENV):
        return f"py-spy not found at {env[PY_SPY_ENV]} ({PY_SPY_ENV}); unset it or point it at py-spy"
    return (
        f"py-spy not found (neither beside {sys.executable} nor on PATH); install it: "
        "`pip install py-spy` (scripts/setup does)"
    )


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def dump(binary: Path, pid: int, mode: Mode, timeout_s: float, owners: bool = False) -> list[dict[str, Any]]:
    """py-spy's JSON for one process: a list of thread objects. Raises CaptureError. `owners`: read each
    frame's locals too (--locals), for the address of its `self` (parse_dump keeps nothing else)."""
    argv = [str(binary), "dump", "--pid", str(pid), "--json", *mode.flags, *(("--locals",) if owners else ())]
    # No Rust backtrace in the error text; nothing inherited may make py-spy wait for input.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUST_BACKTRACE": "0", "LANG": "C.UTF-8"}
    try:
        result = run_tool(argv, timeout_s, env)
    except ToolUnavailable as err:
        raise CaptureError(Failure.UNAVAILABLE, err.message) from err
    if result.timed_out:
        raise CaptureError(Failure.TIMEOUT, f"no answer within {timeout_s:.1f}s")
    if result.returncode != 0:
        raise classify_error(
            result.stderr.decode("utf-8", "replace") or result.stdout.decode(errors="replace")
        )
    try:
        data = json.loads(result.stdout)
    except ValueError as err:
        raise CaptureError(Failure.FAILED, f"printed no JSON: {err}") from err
    if not isinstance(data, list):
        raise CaptureError(Failure.FAILED, "printed unexpected JSON")
    return data


_WAITPID_SIGNAL = re.compile(r"unexpected waitpid result PtraceEvent\(Pid\(\d+\), (SIG\w+)")


def classify_error(text: str) -> CaptureError:
    """Turn py-spy's error text into a failure kind and one readable line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    message = "; ".join(
        ln.removeprefix("Error: ") for ln in lines if not ln.startswith(("Caused by", "Stack"))
    )
    lowered = text.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return CaptureError(Failure.DENIED, "ptrace permission denied")
    if "failed to find python version" in lowered or "both python and libpython are invalid" in lowered:
        return CaptureError(Failure.NOT_PYTHON, "not a Python process (py-spy found no interpreter)")
    if "check that the process is running" in lowered or "no such process" in lowered:
        return CaptureError(Failure.GONE, "the process exited during the dump")
    stop = _WAITPID_SIGNAL.search(text)
    if stop:
        return CaptureError(Failure.FAILED, f"could not pause it: it is stopped by {stop.group(1)}")
    return CaptureError(Failure.FAILED, message[:300] or "failed without a message")


def parse_dump(
    data: list[dict[str, Any]], states: Mapping[int, str] | None = None
) -> tuple[ThreadStack, ...]:
    """py-spy's JSON threads -> ThreadStacks, frames innermost first (py-spy's order). Native frames carry
    the shared object they live in as `module` (Python frames have none) and no line number."""
    states = states or {}
    threads = []
    for t in data:
        tid = t.get("os_thread_id")
        frames = tuple(_frame(f) for f in t.get("frames") or ())
        threads.append(
            ThreadStack(
                tid=tid,
                name=t.get("thread_name"),
                frames=frames,
                state=states.get(tid) if tid is not None else None,
                active=t.get("active"),
                ident=_int(t.get("thread_id")),
            )
        )
    return tuple(threads)


def _frame(f: dict[str, Any]) -> Frame:
    native = f.get("module") is not None
    line = f.get("line")
    return Frame(
        function=str(f.get("name") or "?"),
        file=str(f.get("filename") or ""),
        line=None if native and not line else line,
        native=native,
        owner=_owner(f.get("locals")),
        rlocks=_rlocks(f.get("locals")),
    )


def _owner(local_vars: object) -> int | None:
    """The address of the frame's first argument named `self` (--locals): its value is not kept."""
    if not isinstance(local_vars, list):
        return None
    for var in local_vars:
        if isinstance(var, dict) and var.get("name") == "self" and var.get("arg"):
            addr = var.get("addr")
            return addr if isinstance(addr, int) and not isinstance(addr, bool) and addr > 0 else None
    return None


_RLOCK_REPR = "<_thread.RLock at 0x"  # how py-spy writes an object of the C RLock type (it runs no repr)


def _rlocks(local_vars: object) -> tuple[LocalRLock, ...]:
    """The frame's locals bound to an RLock (--locals), by name and address; their owner is read later."""
    if not isinstance(local_vars, list):
        return ()
    found = []
    for var in local_vars:
        if not isinstance(var, dict) or not str(var.get("repr") or "").startswith(_RLOCK_REPR):
            continue
        addr, name = _int(var.get("addr")), var.get("name")
        if addr and isinstance(name, str):
            found.append(LocalRLock(name[:64], addr))
    return tuple(found)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

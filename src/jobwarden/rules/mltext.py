"""What the ML stack prints when one of a job's processes dies, parsed: torchrun's ChildFailedError report,
the tracebacks torch.distributed prefixes with `[rankN]:`, the elastic agent's SignalException, the
DataLoader's worker-death messages, and the GPU stack's errors (NCCL watchdog, CUDA, cuBLAS, the kernel's
Xid lines).

Each parser takes log lines and returns what it found (None, or an empty result, when nothing); pure: no
I/O, no clock. The formats are those recorded from torch 2.13.0, loky 3.7.0, joblib 1.6.0 and CPython 3.11
in tests/fixtures/mlstack (its README says how), plus GPU texts quoted in public issue threads.

Frames are `jobwarden.observations.Frame`, innermost first, as jobwarden keeps every stack.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from itertools import pairwise
from typing import NamedTuple

from jobwarden.observations import Frame
from jobwarden.rules.frames import is_library

__all__ = [
    "AgentSignal",
    "ChildFailed",
    "DataLoaderDeath",
    "FailedRank",
    "GpuError",
    "PyTraceback",
    "child_failed",
    "dataloader_death",
    "gpu_errors",
    "parse_traceback",
    "rank_tracebacks",
    "signal_exception",
    "user_frame",
]


# --- Python tracebacks --------------------------------------------------------------------------------


class PyTraceback(NamedTuple):
    """A Python traceback as printed: the exception that ended it and its frames, innermost first.
    `exc_type` is as printed ('ValueError', 'concurrent.futures.process.BrokenProcessPool'); `message` is
    the exception line's text after the colon (its first line only)."""

    exc_type: str
    message: str
    frames: tuple[Frame, ...] = ()


_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
# "ValueError: bad", "pkg.errors.ConfigError: x", or a bare "AssertionError" (no message, no colon)
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: ?(?P<msg>.*))?$")


def parse_traceback(lines: Sequence[str]) -> PyTraceback | None:
    """The last traceback in `lines`. With chained exceptions ("The above exception was the direct
    cause...") that is the last one printed: the exception that ended the process."""
    start = max((i for i, line in enumerate(lines) if line.strip() == _TRACEBACK), default=-1)
    if start < 0:
        return None
    frames: list[Frame] = []
    for line in lines[start + 1 :]:
        m = _FRAME.match(line)
        if m:
            frames.insert(0, Frame(m["func"], m["file"], int(m["line"])))
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            continue  # source lines, 3.11's ^^^^ markers
        e = _EXCEPTION.match(line.strip())
        if e:
            return PyTraceback(e["type"], e["msg"] or "", tuple(frames))
    return None


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame (of `frames`, innermost first) in the user's own code: not a library's, the
    standard library's, or a console-script launcher's (rules.frames.is_library). None when every frame is
    a library's: the caller then shows the innermost frame as it is."""
    return next((f for f in frames if not is_library(f)), None)


# --- torchrun: the ChildFailedError report ------------------------------------------------------------


class FailedRank(NamedTuple):
    """One entry of torchrun's ChildFailedError report (torch/distributed/elastic/multiprocessing/errors).

    `signal` is set when the exit code is negative, or when the entry names one. `time` is as printed, the
    agent's local time ('2026-11-23_22:46:42'): the error file's timestamp when there was one, else when
    the agent noticed. `error_file` is None for '<N/A>': the rank wrote none (not run under @record, or
    killed by a signal before it could). `text` is the traceback field, de-indented; `message` its first
    line ('Signal 9 (SIGKILL) received by PID 7320', 'To enable traceback see: ...', 'Traceback (most
    recent call last):'); `traceback` is the parsed traceback when the error file held one."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int
    signal: str | None
    host: str
    time: str
    error_file: str | None
    message: str
    text: tuple[str, ...]
    traceback: PyTraceback | None


class ChildFailed(NamedTuple):
    """The report: `name` is the entrypoint as launched ('train.py'; '' when the title was cut off), the
    root cause is the failure with the earliest timestamp, ties broken by the agent's order."""

    name: str
    root_cause: FailedRank
    other_failures: tuple[FailedRank, ...]


_ROOT_CAUSE = "Root Cause (first observed failure):"
_FAILURES = "Failures:"
_ENTRY = re.compile(r"^\[\d+\]:$")
_FIELD = re.compile(r"^  (?P<key>time|host|rank|exitcode|error_file|traceback)\s*: ?(?P<value>.*)$")
_RANK = re.compile(r"^(-?\d+) \(local_rank: (-?\d+)\)")
_EXITCODE = re.compile(r"^(-?\d+) \(pid: (\d+)\)(?:\s*\((SIG\w+)\))?")
_SIGNAL_MESSAGE = re.compile(r"^Signal (\d+) \((SIG\w+)\)")
_RULE = re.compile(r"^(?:=+|-+)$")
_BORDER = re.compile(r"^=+$")
_TITLE = re.compile(r"^(.*) FAILED$")


def child_failed(lines: Sequence[str]) -> ChildFailed | None:
    """The last ChildFailedError report in `lines`; None without one, or when its root-cause entry is cut
    off before its rank, pid and exit code."""
    text = [line.rstrip("\r\n") for line in lines]
    root_at = max((i for i, line in enumerate(text) if line.strip() == _ROOT_CAUSE), default=-1)
    if root_at < 0:
        return None
    end = next((i for i in range(root_at + 1, len(text)) if _BORDER.match(text[i])), len(text))
    roots = _entries(text[root_at + 1 : end])
    if not roots:
        return None
    top = next((i for i in range(root_at - 1, -1, -1) if _BORDER.match(text[i])), -1)
    failures_at = next((i for i in range(top + 1, root_at) if text[i] == _FAILURES), top)
    title = next((m[1] for line in text[top + 1 : root_at] if (m := _TITLE.match(line))), "")
    return ChildFailed(title, roots[0], tuple(_entries(text[failures_at + 1 : root_at])))


def _entries(block: Sequence[str]) -> list[FailedRank]:
    starts = [i for i, line in enumerate(block) if _ENTRY.match(line)]
    found = (_entry(block[a + 1 : b]) for a, b in pairwise([*starts, len(block)]))
    return [entry for entry in found if entry is not None]


def _entry(block: Sequence[str]) -> FailedRank | None:
    fields: dict[str, str] = {}
    text: list[str] = []
    for line in block:
        if _RULE.match(line):
            break
        m = _FIELD.match(line)
        if "traceback" in fields:  # the last field: the rest of the entry is its text
            text.append(line[2:] if line.startswith("  ") else line)  # the report indents it by two
        elif m:
            fields[m["key"]] = m["value"]
    text = [fields["traceback"], *text] if "traceback" in fields else []
    rank, exit_ = _RANK.match(fields.get("rank", "")), _EXITCODE.match(fields.get("exitcode", ""))
    if rank is None or exit_ is None:
        return None  # cut off: without who and how it ended, the entry says nothing
    while text and not text[-1].strip():
        text.pop()
    code, message = int(exit_[1]), text[0] if text else ""
    error_file = fields.get("error_file", "").strip()
    return FailedRank(
        int(rank[1]),
        int(rank[2]),
        int(exit_[2]),
        code,
        exit_[3] or _signal_of(code, message),
        fields.get("host", "").strip(),
        fields.get("time", "").strip(),
        None if error_file in ("", "<N/A>") else error_file,
        message,
        tuple(text),
        parse_traceback(text) if message.startswith(_TRACEBACK) else None,
    )


def _signal_of(exitcode: int, message: str) -> str | None:
    m = _SIGNAL_MESSAGE.match(message)
    if m:
        return m[2]
    return _signal_name(-exitcode) if exitcode < 0 else None


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


# --- torchrun: per-rank tracebacks, the agent's own signals --------------------------------------------

# torch.distributed's sys.excepthook (installed by init_process_group) prefixes each line of an uncaught
# exception's report with "[rankN]: ". A torchrun --tee prefix ("[default1]:", or the
# TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE one) may stand before it: the last [rankN]: is the excepthook's.
_RANK_LINE = re.compile(r"^(?:\[[^\]\s]+\]:)*\[rank(?P<rank>\d+)\]: ?(?P<text>.*)$")


def rank_tracebacks(lines: Sequence[str]) -> dict[int, PyTraceback]:
    """{global rank: its last traceback} from the `[rankN]:` lines, which stay apart even when the ranks'
    output interleaves. Ranks without a complete traceback are left out."""
    by_rank: dict[int, list[str]] = {}
    for line in lines:
        m = _RANK_LINE.match(line.rstrip("\r\n"))
        if m:
            by_rank.setdefault(int(m["rank"]), []).append(m["text"])
    parsed = {rank: parse_traceback(own) for rank, own in sorted(by_rank.items())}
    return {rank: tb for rank, tb in parsed.items() if tb is not None}


class AgentSignal(NamedTuple):
    """The elastic agent caught a signal itself (SIGTERM, SIGINT, SIGHUP, SIGQUIT by default:
    --signals-to-handle) and raised SignalException: it forwarded it to the ranks and exited 1."""

    pid: int
    signal: str  # 'SIGHUP'; 'signal 64' for a number without a name
    line: str


_AGENT_SIGNAL = re.compile(r"\bSignalException: Process (\d+) got signal: (\d+)")


def signal_exception(lines: Sequence[str]) -> AgentSignal | None:
    for line in reversed(lines):
        m = _AGENT_SIGNAL.search(line)
        if m:
            number = int(m[2])
            return AgentSignal(int(m[1]), _signal_name(number) or f"signal {number}", line.strip())
    return None


# --- DataLoader ---------------------------------------------------------------------------------------


class DataLoaderDeath(NamedTuple):
    """A DataLoader worker died, from the most specific of PyTorch's messages present. `how`:
    'killed-by-signal' (the SIGCHLD handler's 'is killed by signal: Bus error.'), 'exit-code' ('exited
    unexpectedly with exit code 1'), 'worker-fault' (the worker's own 'ERROR: Unexpected segmentation fault
    encountered in worker.', no pid), 'exited-unexpectedly' (the queue's 'pid(s) 811, 812 exited
    unexpectedly', which follows the others as their chained exception), 'timed-out' (timeout= passed).
    `shm_hint`: PyTorch suggested that /dev/shm is too small (it does on every bus error)."""

    how: str
    pid: int | None
    pids: tuple[int, ...]
    signal: str | None
    exit_code: int | None
    shm_hint: bool
    line: str


_DL_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.")
_DL_EXIT_CODE = re.compile(r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_DL_FAULT = re.compile(r"ERROR: Unexpected (bus error|segmentation fault|floating-point exception) encount")
_DL_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
_DL_TIMEOUT = re.compile(r"DataLoader timed out after \d+ seconds")
_DL_SHM = re.compile(r"out of shared memory|insufficient shared memory")
_FAULT_SIGNALS = {
    "bus error": "SIGBUS",
    "segmentation fault": "SIGSEGV",
    "floating-point exception": "SIGFPE",
}
# strsignal(3) texts (glibc), as PyTorch prints them, to the signal's name
_STRSIGNAL = {
    "Hangup": "SIGHUP",
    "Interrupt": "SIGINT",
    "Quit": "SIGQUIT",
    "Illegal instruction": "SIGILL",
    "Trace/breakpoint trap": "SIGTRAP",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Killed": "SIGKILL",
    "User defined signal 1": "SIGUSR1",
    "Segmentation fault": "SIGSEGV",
    "User defined signal 2": "SIGUSR2",
    "Broken pipe": "SIGPIPE",
    "Alarm clock": "SIGALRM",
    "Terminated": "SIGTERM",
    "CPU time limit exceeded": "SIGXCPU",
    "File size limit exceeded": "SIGXFSZ",
}


def dataloader_death(lines: Sequence[str]) -> DataLoaderDeath | None:
    found = {how: _last_match(lines, pattern) for how, pattern in _DL_MESSAGES}
    for how, _ in _DL_MESSAGES:
        hit = found[how]
        if hit is not None:
            return _dl_death(how, hit, found, any(_DL_SHM.search(line) for line in lines))
    return None


def _dl_death(how: str, hit: _Hit, found: dict[str, _Hit | None], shm: bool) -> DataLoaderDeath:
    line, m = hit
    exited = found["exited-unexpectedly"]
    pids = tuple(int(p) for p in re.split(r"[,\s]+", exited[1][1].strip())) if exited else ()
    pid = int(m[1]) if how in ("killed-by-signal", "exit-code") else (pids[0] if pids else None)
    return DataLoaderDeath(
        how,
        pid,
        pids or ((pid,) if pid is not None else ()),
        _dl_signal(found["killed-by-signal"], found["worker-fault"]),
        int(m[2]) if how == "exit-code" else None,
        shm,
        line.strip(),
    )


_DL_MESSAGES = (  # most specific first
    ("killed-by-signal", _DL_KILLED),
    ("exit-code", _DL_EXIT_CODE),
    ("worker-fault", _DL_FAULT),
    ("exited-unexpectedly", _DL_EXITED),
    ("timed-out", _DL_TIMEOUT),
)

_Hit = tuple[str, re.Match[str]]


def _last_match(lines: Sequence[str], pattern: re.Pattern[str]) -> _Hit | None:
    for line in reversed(lines):
        m = pattern.search(line)
        if m:
            return line, m
    return None


def _dl_signal(killed: _Hit | None, fault: _Hit | None) -> str | None:
    if killed is not None:
        text = killed[1][2].strip()
        return _STRSIGNAL.get(text, text)
    return _FAULT_SIGNALS[fault[1][1]] if fault is not None else None


# --- the GPU stack ------------------------------------------------------------------------------------


class GpuError(NamedTuple):
    """A known GPU-stack error line. `kind`:
    'nccl-timeout'   NCCL's watchdog: 'Watchdog caught collective operation timeout: WorkNCCL(...)';
                     `code` is the collective (OpType): the rank that reports it is often a victim
    'cuda-kernel-assert'  a kernel's 'Assertion `t >= 0 && t < n_classes` failed.'; `code` the condition
    'cuda-device-assert'  'CUDA error: device-side assert triggered' (the Python side of the above)
    'cublas'         a CUBLAS_STATUS_* error; `code` is the status
    'cuda-illegal-memory-access'  'an illegal memory access was encountered'
    'gpu-ecc'        an uncorrectable ECC error: CUDA's message, or an ECC Xid (48, 63, 64, 92, 94, 95)
    'gpu-off-bus'    the GPU fell off the bus: Xid 79, or the driver's message without an Xid
    'xid'            any other Xid line of the NVIDIA driver in the kernel log
    'gloo-size-mismatch'  gloo's 'op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match
                     expected size': a peer sent more than this rank's collective expects (the ranks called
                     it with other shapes), and gloo aborts this rank (SIGABRT); `code` is '8 vs 4'
    For Xid lines `code` is the Xid number, `device` the PCI address, `pid` the process when known.
    `rank` is the rank the line names ('[Rank 3]', '[rank3]:'), if any."""

    kind: str
    line: str
    code: str | None = None
    rank: int | None = None
    pid: int | None = None
    device: str | None = None


_XID = re.compile(r"NVRM: Xid \((?P<device>PCI:[0-9A-Fa-f:.]+)\): (?P<code>\d+),(?: pid='?(?P<pid>\d+)?)?")
_ECC_XIDS = frozenset({"48", "63", "64", "92", "94", "95"})  # NVIDIA's Xid catalog: memory ECC events
_GPU_TEXTS = (  # the first that matches a line names it
    (
        "nccl-timeout",
        re.compile(r"Watchdog caught collective operation timeout(?:: WorkNCCL\([^)]*?OpType=(\w+))?"),
    ),
    ("cuda-kernel-assert", re.compile(r"\.cuh?:\d+: .*Assertion `(.+)` failed")),
    ("cuda-device-assert", re.compile(r"device-side assert triggered")),
    ("cublas", re.compile(r"\b(CUBLAS_STATUS_[A-Z_]+)\b")),
    ("cuda-illegal-memory-access", re.compile(r"an illegal memory access was encountered")),
    ("gpu-ecc", re.compile(r"uncorrectable ECC error encountered")),
    ("gpu-off-bus", re.compile(r"fallen off the bus")),
    ("nccl-duplicate-gpu", re.compile(r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device")),
    ("gloo-size-mismatch", re.compile(r"(?:(\d+ vs \d+)\. )?Received data size doesn't match expected size")),
)
_NAMED_RANK = re.compile(r"\[(?:PG [^\]]*?)?[Rr]ank ?(\d+)\]")


def gpu_errors(lines: Sequence[str]) -> list[GpuError]:
    """Every known GPU-stack error line, in order; a line is named once, by its most specific kind."""
    return [found for line in lines if (found := _gpu_error(line.strip())) is not None]


def _gpu_error(line: str) -> GpuError | None:
    xid = _XID.search(line)
    if xid:
        code = xid["code"]
        kind = "gpu-ecc" if code in _ECC_XIDS else "gpu-off-bus" if code == "79" else "xid"
        pid = int(xid["pid"]) if xid["pid"] else None
        return GpuError(kind, line, code, None, pid, xid["device"])
    for kind, pattern in _GPU_TEXTS:
        m = pattern.search(line)
        if m:
            rank = _NAMED_RANK.search(line)
            return GpuError(kind, line, m[1] if m.groups() else None, int(rank[1]) if rank else None)
    return None

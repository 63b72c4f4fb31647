"""The faulthandler fallback: ask a job's Python process to write its own stacks, without ptrace.

jobwarden's Python hook registers `faulthandler` on a signal in every Python process of a job
(`faulthandler.register(sig, file=..., all_threads=True)`) and advertises it in `<py_dir>/<pid>.json`
(`probes.pyhooks.HookAdvert`). faulthandler's handler is C code that needs neither the GIL nor a healthy
interpreter, so it answers even when the process is deadlocked in C.

The signal's default action is death, and an advert outlives what it describes: it is sent through
`osapi.asking`, only while the process is the one that wrote the advert, runs the interpreter that wrote it
(an exec() into another program keeps the pid and start time but drops the handler), and catches the signal.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.observations import Frame, ThreadStack
from jobwarden.osapi import asking
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pyhooks import HookAdvert, writes_to_its_file
from jobwarden.probes.stackbase import CaptureError, Deadline, Failure

_POLL_S = 0.01
_SETTLED_POLLS = 3  # the handler writes in many small write()s: done once the size holds still this long
_MAX_READ = 4 << 20  # 100 threads x 100 frames of long paths stay far below this


def request_dump(advert: HookAdvert, procfs: ProcFS, deadline: Deadline) -> tuple[ThreadStack, ...]:
    """Signal the process to dump and read what it appends to its fault file. Raises CaptureError."""
    if advert.withdrawn:
        raise CaptureError(
            Failure.FAILED,
            f"not signalled: {advert.withdrawn}, so the signal would run the job's code (or end it) instead "
            "of dumping its stacks",
        )
    if not advert.dumps_on_signal or advert.fault_file is None:
        raise CaptureError(
            Failure.FAILED, "its hooks did not say which signal dumps its stacks: not signalled"
        )
    _check_its_file(advert, procfs)
    before = _size(advert.fault_file)
    _signal(advert, procfs)
    text = _wait_for_dump(advert.fault_file, before, deadline)
    threads = parse_faulthandler(text)
    if not threads:
        raise CaptureError(Failure.FAILED, f"faulthandler wrote nothing readable to {advert.fault_file}")
    return threads


def _check_its_file(advert: HookAdvert, procfs: ProcFS) -> None:
    """faulthandler writes, from C, to the descriptor it registered: a job that closed it and opened its
    own file under the number would get the dump in its data. Raises CaptureError unless it is ours; a
    process that is gone, or exec()ed, is said as such first."""
    if writes_to_its_file(advert, procfs):
        return
    try:
        answer = asking.will_handle(procfs, advert.process, advert.fault_signal, advert.program)
    except AccessDenied as err:
        raise CaptureError(Failure.DENIED, f"not allowed to look at it: {err.message}") from err
    _refuse(answer, procfs, advert)
    raise CaptureError(
        Failure.FAILED,
        f"not signalled: its faulthandler writes to descriptor {advert.fault_fd}, which is no longer "
        f"{advert.fault_file} (the job closed it; the number may hold a file of its own now)",
    )


def _signal(advert: HookAdvert, procfs: ProcFS) -> None:
    try:
        answer = asking.ask(procfs, advert.process, advert.fault_signal, advert.program)
    except AccessDenied as err:
        raise CaptureError(Failure.DENIED, f"not allowed to signal it: {err.message}") from err
    _refuse(answer, procfs, advert)


def _refuse(answer: asking.Answer, procfs: ProcFS, advert: HookAdvert) -> None:
    """CaptureError for any answer but HANDLED."""
    if answer is asking.Answer.GONE:
        if _reused(procfs, advert):
            raise CaptureError(
                Failure.FAILED,
                "its faulthandler advert belongs to an earlier process with this pid: not signalled",
            )
        raise CaptureError(Failure.GONE, "the process exited before it could be asked to dump")
    if answer is not asking.Answer.HANDLED:
        raise CaptureError(Failure.FAILED, f"faulthandler not asked: {answer.value}")


def _reused(procfs: ProcFS, advert: HookAdvert) -> bool:
    try:
        return procfs.stat(advert.pid).start_time != advert.start_time
    except (ProcessGone, AccessDenied):
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _wait_for_dump(path: Path, before: int, deadline: Deadline) -> str:
    """The bytes appended after `before`, once they stop growing; CaptureError at the deadline."""
    size, still = before, 0
    while still < _SETTLED_POLLS or size == before:
        if deadline.expired:
            if size > before:
                break  # a dump that was still being written: take what is there
            raise CaptureError(
                Failure.TIMEOUT,
                f"faulthandler wrote nothing to {path} before the deadline (every thread may be blocked "
                "in the kernel, or the signal is blocked)",
            )
        time.sleep(_POLL_S)
        now = _size(path)
        still = still + 1 if now == size else 0
        size = now
    with open(path, "rb") as fh:
        fh.seek(before)
        return fh.read(min(size - before, _MAX_READ)).decode("utf-8", "replace")


# CPython's faulthandler text (Python/traceback.c), unchanged in form from 3.3 to 3.13:
#   Thread 0x00007f... (most recent call first):
#     File "/path/x.py", line 12 in worker
#   Current thread 0x00007f... (most recent call first):
#   Stack (most recent call first):            <- all_threads=False
# Other lines: "  <no Python frame>", "  ...", "  <truncated rest of calls>", "line ???" for an unknown line.
# Newer versions may name the thread ("Thread 0x... [name] (most recent...)"): accepted.
_HEADER = re.compile(
    r"^(?:(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])?|Stack)"
    r" \(most recent call first\):$"
)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.*)$')


def parse_faulthandler(text: str) -> tuple[ThreadStack, ...]:
    """faulthandler's dump -> ThreadStacks, innermost first. faulthandler names threads by their pthread
    id, not the kernel tid, so `tid` stays None and the id goes into `name`, as `0x...` (or the thread's
    name where the Python version writes it). Only the first dump in `text` is taken."""
    threads: list[ThreadStack] = []
    name: str | None = None
    frames: list[Frame] = []
    seen: set[str] = set()

    def close() -> None:
        if name is not None:
            threads.append(ThreadStack(tid=None, name=name, frames=tuple(frames)))

    for line in text.splitlines():
        header = _HEADER.match(line.rstrip())
        if header:
            ident = header.group(2) or "stack"
            if ident in seen:  # a second dump appended meanwhile
                break
            close()
            seen.add(ident)
            name, frames = header.group("name") or ident, []
            continue
        frame = _FRAME.match(line)
        if frame and name is not None:
            lineno = frame.group("line")
            frames.append(
                Frame(frame.group("func"), frame.group("file"), int(lineno) if lineno.isdigit() else None)
            )
    close()
    return tuple(threads)

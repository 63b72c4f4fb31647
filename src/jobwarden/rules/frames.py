"""Reading stacks the way an engineer does: which frames are ours and which are the library's, where a thread
waits, and how to write a frame in a finding ("function (file:line)").

Function names differ across Python versions: py-spy shows `ApplyResult.get` on 3.11+ (co_qualname) and
`get` on 3.8-3.10, so matching is on the last component of the name plus the file's path suffix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from jobwarden.observations import Frame, ProcessStack, ThreadStack

_LIBRARY_DIRS = ("/site-packages/", "/dist-packages/")
_STDLIB = re.compile(r"/lib/python\d+\.\d+t?/(?P<rest>.+)$")
_HEX_ONLY = re.compile(r"^0x[0-9a-f]+$")
# pip's console-script launchers (venv/bin/torchrun) have no .py suffix and are no one's own code
_LAUNCHER = re.compile(r"/bin/[^/.]+$")
_MAX_FRAMES = 6  # frames quoted per stack in evidence: enough to see the call path, short enough to read


def short_file(path: str) -> str:
    """'multiprocessing/pool.py' for the stdlib, 'torch/utils/data/dataloader.py' for a package, the
    basename for a shared library, and user files unchanged: their full path is what the reader opens."""
    for marker in _LIBRARY_DIRS:
        if marker in path:
            return path.split(marker, 1)[1]
    m = _STDLIB.search(path)
    if m:
        return m["rest"]
    if ".so" in path.rpartition("/")[2]:
        return path.rpartition("/")[2]
    return path


def name(frame: Frame) -> str:
    """The bare function name: 'ApplyResult.get' and 'get' both give 'get'."""
    return frame.function.rpartition(".")[2]


def is_in(frame: Frame, *suffixes: str) -> bool:
    return frame.file.endswith(suffixes)


def is_library(frame: Frame) -> bool:
    return (
        frame.native
        or frame.file.startswith("<frozen")
        or any(m in frame.file for m in _LIBRARY_DIRS)
        or bool(_STDLIB.search(frame.file) or _LAUNCHER.search(frame.file))
    )


def is_noise(frame: Frame) -> bool:
    """A native frame py-spy could not name (a bare address): it tells the reader nothing."""
    return frame.native and bool(_HEX_ONLY.match(frame.function))


def where(frame: Frame) -> str:
    if frame.native:
        lib = short_file(frame.file)
        return f"{frame.function} ({lib})" if lib else frame.function
    line = f":{frame.line}" if frame.line else ""
    return f"{frame.function} ({short_file(frame.file)}{line})"


def python_frames(thread: ThreadStack) -> list[Frame]:
    return [f for f in thread.frames if not f.native]


def call_site(thread: ThreadStack) -> Frame | None:
    """The innermost frame of the job's own code: where the job called into the library that waits."""
    return next((f for f in thread.frames if not is_library(f)), None)


def path_of(frames: Iterable[Frame], limit: int = _MAX_FRAMES) -> str:
    """'a (x.py:1) <- b (y.py:2) <- ...', innermost first, unnamed native frames left out."""
    shown = [where(f) for f in frames if not is_noise(f)]
    more = f" <- ... ({len(shown) - limit} more)" if len(shown) > limit else ""
    return " <- ".join(shown[:limit]) + more


def main_thread(stack: ProcessStack) -> ThreadStack | None:
    for thread in stack.threads:
        if thread.name == "MainThread" or thread.tid == stack.pid:
            return thread
    return stack.threads[0] if stack.threads else None


def find_frame(thread: ThreadStack, suffix: str, names: Iterable[str]) -> Frame | None:
    """The innermost frame of `thread` in a file ending with `suffix` whose bare name is one of `names`."""
    wanted = set(names)
    return next((f for f in thread.frames if is_in(f, suffix) and name(f) in wanted), None)


def threads_with(
    stack: ProcessStack, suffix: str, names: Iterable[str]
) -> Iterator[tuple[ThreadStack, Frame]]:
    wanted = tuple(names)
    for thread in stack.threads:
        frame = find_frame(thread, suffix, wanted)
        if frame is not None:
            yield thread, frame


def thread_label(thread: ThreadStack) -> str:
    tid = f" (tid {thread.tid})" if thread.tid is not None else ""
    return f"thread '{thread.name}'{tid}" if thread.name else f"thread{tid or ' ?'}"

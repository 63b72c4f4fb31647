"""What a process of the job is called in a finding: by what it is, never "worker" by default.

A job's tree holds more than workers: a multiprocessing Manager's server, its resource tracker, a
`subprocess.Popen` child, a shell's command, a launcher's helper. Calling each "worker pid N" sends the
reader to look for a pool that does not exist. The evidence says what each one is:

- its rank (a distributed job's `RANK`): "rank 1 (pid 4242)";
- the code it ran (its last stack, its exception's frames): a Pool's or a DataLoader's worker loop, a
  Manager's server loop;
- its command line: the multiprocessing helpers run as `python -c "from multiprocessing.resource_tracker
  import main; ..."`, a spawned child as `... spawn_main(...) --multiprocessing-fork`;
- the wrapper the main process reported it with (BrokenProcessPool: a ProcessPoolExecutor's worker);
- else its command's short name: "process pid 811 (sort)".
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable

from jobwarden.observations import Frame

# (a file's path ends with, a function) -> what a process whose stack holds that frame is
_LOOPS = (
    ("multiprocessing/managers.py", "serve_forever", "multiprocessing Manager server"),
    ("multiprocessing/pool.py", "worker", "Pool worker"),
    ("torch/utils/data/_utils/worker.py", "_worker_loop", "DataLoader worker"),
    ("concurrent/futures/process.py", "_process_worker", "ProcessPoolExecutor worker"),
    ("multiprocessing/resource_tracker.py", "main", "multiprocessing resource tracker"),
    ("multiprocessing/forkserver.py", "main", "multiprocessing fork server"),
)
# a module a helper's command line runs -> what it is
_HELPER_MODULES = (
    ("multiprocessing.resource_tracker", "multiprocessing resource tracker"),
    ("multiprocessing.semaphore_tracker", "multiprocessing resource tracker"),
    ("multiprocessing.forkserver", "multiprocessing fork server"),
)
_SPAWNED = ("--multiprocessing-fork", "multiprocessing.spawn")
# roles a wrapper names that are a pool's workers: the only ones called "worker" without other evidence
WORKER_ROLES = frozenset(
    {"ProcessPoolExecutor worker", "executor worker", "loky worker", "DataLoader worker", "Pool worker"}
)
_INTERPRETERS = frozenset({"python", "python3", "sh", "bash", "dash", "zsh", "env", "perl", "ruby", "node"})


def process_name(
    pid: int,
    cmdline: str = "",
    frames: Iterable[Frame] = (),
    role: str | None = None,
    rank: int | None = None,
) -> str:
    """'rank 1 (pid 4242)', 'Pool worker pid 811', 'multiprocessing Manager server (pid 812)',
    'process pid 813 (sort)'. `role`: what the main process's report calls its failed children (a
    WORKER_ROLES entry, or "rank"); used only where the process's own evidence says nothing better."""
    if rank is not None:
        return f"rank {rank} (pid {pid})"
    kind = _kind_by_code(frames) or _kind_by_command(cmdline)
    if kind in WORKER_ROLES:
        return f"{kind} pid {pid}"
    if kind is not None:
        return f"{kind} (pid {pid})"
    if role in WORKER_ROLES:
        return f"{role} pid {pid}"
    short = short_command(cmdline)
    return f"process pid {pid} ({short})" if short else f"process pid {pid}"


def _kind_by_code(frames: Iterable[Frame]) -> str | None:
    for frame in frames:
        file = frame.file.replace("\\", "/")
        for tail, function, kind in _LOOPS:
            if frame.function == function and file.endswith(tail):
                return kind
    return None


def _kind_by_command(cmdline: str) -> str | None:
    for module, kind in _HELPER_MODULES:
        if module in cmdline:
            return kind
    if any(mark in cmdline for mark in _SPAWNED):
        return "multiprocessing child"
    return None


def short_command(cmdline: str) -> str:
    """The command's short name: `sort -k2 big.txt` -> 'sort'; an interpreter's script or module:
    `python train.py` -> 'train.py', `python -m torch.distributed.run` -> 'torch.distributed.run',
    `sh -c 'sleep 9'` -> 'sh -c sleep'; a process that died before its command line could be read, as
    the shim wrote it: '[child of pid 4] python x.py' -> 'child of pid 4', '[sort]' -> 'sort'. '' when
    unknown."""
    if cmdline.startswith("[") and "]" in cmdline:
        return cmdline[1 : cmdline.index("]")][:40]
    try:
        argv = shlex.split(cmdline)
    except ValueError:
        argv = cmdline.split()
    if not argv:
        return ""
    first = os.path.basename(argv[0])
    if first.rstrip("0123456789.") not in _INTERPRETERS or len(argv) < 2:
        return first[:40]
    if argv[1] in ("-m", "-c") and len(argv) > 2:
        said = argv[2].split()[0] if argv[1] == "-c" and argv[2].split() else argv[2]
        return f"{first} -c {said}"[:40] if argv[1] == "-c" else argv[2][:40]
    script = next((a for a in argv[1:] if not a.startswith("-")), "")
    return os.path.basename(script)[:40] if script else first[:40]

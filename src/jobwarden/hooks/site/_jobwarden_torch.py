"""Part of jobwarden's Python hooks (_jobwarden_hooks.py): PyTorch's flight recorder served to the shim,
loaded into the hooks' namespace (`load_part`) the first time a process imports torch.distributed. A process
without it pays nothing for it at start-up. The hooks' rules hold: standard library only, 3.8 syntax, never
break the job.
"""

from __future__ import annotations

import _thread
import mmap  # here, not in the answer: importing reads its file, I/O of the rank's (_write_mapped)
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: at run time these are the hooks' own globals, this part runs among them
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any

    from jobwarden.hooks.site._jobwarden_hooks import (
        _int,
        _Job,
        _job,
        _record_rank,
        _report,
        _write_atomic,
        dumps,
        file_id,
    )


# --- PyTorch's flight recorder, read on the shim's request -----------------------------------------------
#
# On a hang every rank's main thread sits in C++ (work.wait() in a collective): a signal handler of Python's
# would never run there. One thread of the hooks' per rank blocks in read() on a FIFO (no CPU while idle, no
# timer) and, for each byte the shim writes, dumps the recorder from torch's C++ side, which it may call from
# any thread (docs.pytorch.org, "Flight Recorder for Debugging Stuck Jobs"; measured in research/ranks.md).

RECORDER_REQUEST = ".fr.req"
RECORDER_DUMP = ".fr.json"
RECORDER_ARRIVALS = ".fr.poll.json"
POLL_REQUEST = b"p"  # a request of these bytes only: when the last collectives were called (no hang's dump)
POLL_ENTRIES = 256  # hooks.FLIGHT_RECORDER_ENTRIES: the whole buffer, with the shim asking every few seconds
POLL_MAX_ENTRIES = 1024  # a user's larger buffer: polls go unanswered (a dump costs 4-6 us an entry)
RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # hooks.FLIGHT_RECORDER_ENV
RECORDER_ENTRIES = 64  # the last ones: ranks diverge at the collectives they wait in, the newest
RECORDER_FRAMES = 16
RECORDER_MAX_BYTES = 1 << 20


def hook_torch_distributed(module: ModuleType) -> None:
    """Wrap init_process_group (torch.distributed's name, and every torch.distributed module's that bound
    it): once it returns, the process is a rank with collectives to record. torch is never imported here."""
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "_jobwarden", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        job = _job
        if job is not None:
            try:
                serve_recorder(job, os.environ)
            except Exception as err:  # the job has its group: only the recorder's reading is lost
                _report(job, "flight recorder", err)
        return result

    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(init_process_group, name, getattr(original, name, None))
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]  # inspect.signature follows it
    init_process_group._jobwarden = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group  # type: ignore[attr-defined]
    # torch's own modules that bound the function as they were imported: distributed_c10d, and
    # device_mesh, whose init_device_mesh() creates the default group where the script did not
    for name, imported in list(sys.modules.items()):
        if (
            name.startswith("torch.distributed.")
            and getattr(imported, "init_process_group", None) is original
        ):
            imported.init_process_group = init_process_group  # type: ignore[attr-defined]


def recorder_on(environ: Mapping[str, str]) -> bool:
    """torch reads the first name, then the second: a size of 0 (or none) records nothing."""
    return recorder_entries(environ) > 0


def recorder_entries(environ: Mapping[str, str]) -> int:
    """The recorder's size, as torch reads it: the first name set, then the second; 0 for none."""
    for name in RECORDER_ENV:
        if name in environ:
            return max(_int(environ.get(name)), 0)
    return 0


def serve_recorder(job: _Job, environ: Mapping[str, str]) -> bool:
    """Start the recorder's thread, once per process; False where there is nothing to serve."""
    if job.recorder_thread is not None or not recorder_on(environ):
        return False
    dump = _recorder_dump()
    if dump is None:
        return False
    path = job.path(job.pid, RECORDER_REQUEST)
    try:  # noqa: SIM105 - a FIFO left by an earlier process of this pid
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)
    # O_RDWR: this process is a writer too, so read() never sees end-of-file between the shim's requests
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    job.recorder_fd, job.recorder_fd_id = fd, file_id(fd)
    polls = recorder_entries(environ) <= POLL_MAX_ENTRIES
    job.recorder_thread = _thread.start_new_thread(_recorder_loop, (job, job.pid, fd, dump, polls))
    return True


def _recorder_dump() -> Callable[[bool], dict[str, Any]] | None:
    """torch's dump: `dump(stacks)` returns its plain values. Two forms: the pickled one (made by this very
    process, of plain values) carries each entry's Python stack, and its first call costs a second or more
    (torch symbolises the stacks: 1.15 s measured, 1.9 s on a loaded machine); without stacks it takes
    0.1 ms. None for a torch without the recorder."""
    c10d = getattr(sys.modules.get("torch._C"), "_distributed_c10d", None)
    pickled = getattr(c10d, "_dump_fr_trace", None)
    as_json = getattr(c10d, "_dump_fr_trace_json", None)
    if pickled is None and as_json is None:
        return None

    def dump(stacks: bool) -> dict[str, Any]:
        if pickled is None:
            import json

            return json.loads(as_json(True, False))  # type: ignore[misc, no-any-return]
        import pickle

        return pickle.loads(pickled(True, stacks, False))  # type: ignore[no-any-return]

    return dump


def _recorder_loop(
    job: _Job, pid: int, fd: int, dump: Callable[[bool], dict[str, Any]], polls: bool = True
) -> None:
    """The recorder's thread: asleep in read() until the shim writes a request. It ends when the FIFO is
    no longer its own (the job closed every descriptor and reused the number: its data must not be read).
    A hang's request is answered twice: at once without the stacks, then with them: a shim that cannot
    wait for the slow first symbolisation still has the sequence to compare. A poll (POLL_REQUEST) is
    answered with the arrivals alone, in a file of their own: a hang's answer is never overwritten.
    `polls`: False where the user's recorder is too large for a dump every few seconds."""
    while file_id(fd) == job.recorder_fd_id:
        try:
            request = os.read(fd, 64)
        except OSError:
            return
        if not request:
            return
        try:
            if polls and POLL_REQUEST in request:
                text = arrivals_text(dump(False), pid, _record_rank(), time.time())
                _write_mapped(job.path(pid, RECORDER_ARRIVALS), text)
            if request.replace(POLL_REQUEST, b""):  # any other byte: a hang's request
                for stacks in (False, True):
                    text = recorder_text(dump(stacks), pid, _record_rank(), time.time(), stacks)
                    _write_atomic(job.path(pid, RECORDER_DUMP), text)
        except Exception as err:
            _report(job, "flight recorder dump", err)


def arrivals_text(raw: Mapping[str, Any], pid: int, rank: int | None, at: float) -> str:
    """`<pid>.fr.poll.json`: when this rank called each of its last collectives, and how long each ran
    where torch timed it: [group, seq, op, time_created_ns, duration_ms] (probes.flightrec.read_arrivals).
    1.8 ms of this thread's CPU with 256 entries in the buffer, 1.1 ms of it torch's dump
    (docs/measurements.md)."""
    rows = []
    for e in list(raw.get("entries") or ())[-POLL_ENTRIES:]:
        if e.get("is_p2p"):
            continue  # send/recv pair two ranks, not the group: no step of its own
        group = e.get("process_group")
        rows.append(
            [
                group[0] if isinstance(group, (list, tuple)) and group else None,
                e.get("collective_seq_id"),
                e.get("profiling_name"),
                e.get("time_created_ns"),
                e.get("duration_ms"),
            ]
        )
    return dumps({"pid": pid, "rank": rank, "at": at, "arrivals": rows})


def _write_mapped(path: str, text: str) -> None:
    """As _write_atomic, but through a mapping of the file: write() counts in the rank's I/O (wchar in
    /proc/PID/io), which the shim takes as a sign of progress, and ~20 KB every 10 s would make a hung job
    look busy. A store into a mapping is no read() or write()."""
    data = text.encode()
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, len(data))
        if data:
            with mmap.mmap(fd, len(data)) as mapped:
                mapped[:] = data
    finally:
        os.close(fd)
    os.replace(tmp, path)


def recorder_text(raw: Mapping[str, Any], pid: int, rank: int | None, at: float, stacks: bool) -> str:
    """`<pid>.fr.json`: the recorder's last entries, the fields the comparison reads, below
    RECORDER_MAX_BYTES (halving the entries kept until it fits)."""
    entries = [_recorder_entry(e) for e in list(raw.get("entries") or ())[-RECORDER_ENTRIES:]]
    head = {"pid": pid, "rank": rank, "at": at, "version": str(raw.get("version")), "stacks": stacks}
    while True:
        text = dumps({**head, "entries": entries})
        if len(text) <= RECORDER_MAX_BYTES or not entries:
            return text
        entries = entries[len(entries) // 2 :]


def _recorder_entry(e: Mapping[str, Any]) -> dict[str, object]:
    group = e.get("process_group")
    frames = [
        {"function": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
        for f in list(e.get("frames") or ())[:RECORDER_FRAMES]
        if isinstance(f, dict)
    ]
    return {
        "group": list(group)[:2] if isinstance(group, (list, tuple)) else None,
        "seq": e.get("collective_seq_id"),
        "p2p_seq": e.get("p2p_seq_id"),
        "p2p": e.get("is_p2p"),
        "op": e.get("profiling_name"),
        "sizes": e.get("input_sizes"),
        "dtypes": e.get("input_dtypes"),
        "retired": e.get("retired"),
        "state": e.get("state"),
        "frames": frames,
    }

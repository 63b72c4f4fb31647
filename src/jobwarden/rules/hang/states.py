"""Processes that cannot run at all, from their kernel state: `process-stopped` (T: a stop signal) and
`uninterruptible-io` (D: a kernel wait, usually storage, that signals cannot break).

`process-stopped` fires at once: a stopped process stays stopped until someone sends SIGCONT.
`uninterruptible-io` fires only when the watchdog judged the run hung, and never on a D state known to be
brief: healthy I/O passes through D all the time. In the wait-for graph (rules.hang.graph) a D state is
an edge into the kernel itself: no process holds what it waits for, so the chain ends there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jobwarden.config import format_duration
from jobwarden.model import Finding
from jobwarden.observations import ProcessFacts, ProcessStack
from jobwarden.rules import frames
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.hang import graph
from jobwarden.rules.hang.graph import Edge
from jobwarden.rules.lookup import Lookup, describe

# py-spy 0.4's blocking dump of a group-stopped process fails and names the stop signal
# (docs/measurements.md, "Stack capture")
_PYSPY_STOP = re.compile(r"PtraceEvent\(Pid\(\d+\), (SIG[A-Z]+), 128\)")
_STOP_CAUSES = {
    "SIGSTOP": "someone sent it SIGSTOP (`kill -STOP`, a debugger, or a scheduler suspending the job)",
    "SIGTSTP": "it was suspended from its terminal (Ctrl-Z)",
    "SIGTTIN": "it tried to read from its terminal while in the background",
    "SIGTTOU": "it wrote to its terminal, or changed its modes, while in the background",
}
MIN_D_STATE_S = 10.0  # below this a D state is ordinary I/O latency, not a stuck mount


# --- process-stopped --------------------------------------------------------------------------------


def process_stopped(ev: RunEvidence) -> Finding | None:
    look = Lookup.of(ev)
    stopped = [p for p in ev.processes if p.state == "T" or "T" in p.thread_states]
    if not stopped:
        return None
    signals = {p.pid: _stop_signal(p, look.stacks.get(p.pid)) for p in stopped}
    first = stopped[0]
    sig = signals[first.pid]
    cause = _STOP_CAUSES.get(sig or "", "a job-control signal stopped it")
    evidence = [_stopped_line(p, signals[p.pid], look.stacks.get(p.pid)) for p in stopped[:10]]
    pids = " ".join(str(p.pid) for p in stopped)
    tty = sig in ("SIGTTIN", "SIGTTOU")
    remedy = f"`kill -CONT {pids}` resumes it (`fg` does the same in the shell that started it, if any)."
    if tty:
        remedy += (
            " It stopped because it touched a terminal: run it detached with stdin from /dev/null "
            "(`jobwarden run` does), and keep input(), pdb breakpoints and getpass out of unattended jobs."
        )
    return Finding(
        "process-stopped",
        (f"pid {first.pid} stopped" if len(stopped) == 1 else f"{len(stopped)} processes stopped")
        + (f" by {sig}" if sig else ""),
        f"{describe(first.pid, first.cmdline, 50)} is stopped (state T): {cause}. It makes no progress until "
        "it is continued, and whatever waits on it waits too.",
        "warning",
        tuple(evidence),
        remedy,
        tuple(p.pid for p in stopped),
    )


def _stop_signal(facts: ProcessFacts, stack: ProcessStack | None) -> str | None:
    if facts.stop_signal:
        return facts.stop_signal
    m = _PYSPY_STOP.search(stack.error or "") if stack is not None else None
    return m[1] if m else None


def _stopped_line(facts: ProcessFacts, sig: str | None, stack: ProcessStack | None) -> str:
    line = f"{describe(facts.pid, facts.cmdline)}: state T, wchan {facts.wchan or '?'}"
    if sig:
        line += f", stop signal {sig}"
    thread = frames.main_thread(stack) if stack is not None else None
    if thread is not None and thread.frames:
        line += f"; stopped at {frames.path_of(thread.frames, 2)}"
    return line


# --- uninterruptible-io -----------------------------------------------------------------------------

# (wchan fragments, what it waits for, what to do): the kernel function names of common D-state waits
_WAITS = (
    (
        ("rpc_", "nfs", "__rpc"),
        "an NFS server that does not answer (a hard mount retries forever)",
        "Check the NFS server and the network (`mount | grep nfs`, `nfsstat -c`); the wait is killable, "
        "so SIGKILL ends the job; mount with soft,timeo=... where a failed read is acceptable, or copy the "
        "data to local disk first",
    ),
    (
        ("fuse", "request_wait_answer"),
        "a FUSE filesystem daemon (sshfs, s3fs, gcsfuse...) that does not answer",
        "Restart the FUSE daemon or unmount it lazily (`fusermount -uz MOUNTPOINT`); then restart the job",
    ),
    (
        ("cifs", "smb2", "ceph", "ptlrpc", "ll_", "osc_"),
        "a network filesystem (SMB, CephFS, Lustre) that does not answer",
        "Check the filesystem's servers and the network; copy hot data to local disk",
    ),
    (
        (
            "io_schedule",
            "blk_",
            "bit_wait_io",
            "folio_wait",
            "wait_on_page",
            "lock_page",
            "jbd2",
            "ext4_",
            "xfs_",
            "btrfs_",
            "balance_dirty_pages",
            "wait_on_buffer",
        ),
        "the local disk (slow, saturated or failing)",
        "Look at the disk: `iostat -x 1` for saturation, `dmesg` for I/O errors; the wait ends when the I/O "
        "completes, or never if the device failed",
    ),
    (
        ("kernel_clone", "vfork"),
        "a child started with vfork()/posix_spawn that has not called exec or exited yet",
        "Find the child (the process's newest child) and see why it does not exec; killing the child "
        "releases the parent",
    ),
)


def uninterruptible_io(ev: RunEvidence) -> Finding | None:
    return from_edges(ev, d_state_edges(ev))


def d_state_edges(ev: RunEvidence) -> list[Edge]:
    """The wait-for graph's edges of this signature: each thread stuck in D, waiting in the kernel (its
    wait channel) for no process."""
    if ev.hang_window_s is None:
        return []
    return [
        Edge(p.pid, tid, "kernel", chan, (), "none")
        for p in ev.processes
        if _stuck_in_d(p)
        for tid, chan in _d_wchans(p)
    ]


def from_edges(ev: RunEvidence, edges: Sequence[Edge]) -> Finding | None:
    """`uninterruptible-io` from the graph's edges: kernel waits with no process on the far side."""
    kernel = [e for e in edges if e.kind == "kernel" and e.far == "none"]
    if ev.hang_window_s is None or not kernel:
        return None
    look = Lookup.of(ev)
    stuck = list(dict.fromkeys(e.pid for e in kernel))
    first, wchan = kernel[0].pid, kernel[0].thing
    what, remedy = _classify(wchan)
    evidence = []
    for e in (e for e in kernel if e.pid in stuck[:10]):
        facts = look.processes.get(e.pid)
        since = _since(facts) if facts is not None else ""
        evidence.append(
            f"{describe(e.pid, look.cmdline(e.pid))}: thread {e.tid} in D, wchan {e.thing}{since}"
        )
        evidence.extend(_python_line(look.stacks.get(e.pid), e.tid))
    steps = graph.lead_in(ev.pid, ev.waits, first)
    if steps:  # others wait for it: the chain that ends in the kernel
        end = f"the kernel call has no process on its far side: {what}"
        evidence.append(graph.chain_line(steps, kernel[0], lambda p: describe(p, look.cmdline(p), 40), end))
    return Finding(
        "uninterruptible-io",
        f"Stuck in the kernel (D state) waiting on {wchan}",
        f"pid {first} sits in uninterruptible sleep (D) in {wchan}: it waits for {what}. Signals wait "
        "until the kernel call returns (SIGKILL alone gets through, and only where the wait is killable).",
        "error",
        tuple(evidence),
        remedy + ".",
        tuple(stuck),
    )


def _stuck_in_d(p: ProcessFacts) -> bool:
    in_d = p.state == "D" or "D" in p.thread_states
    brief = p.state_for_s is not None and p.state_for_s < MIN_D_STATE_S
    return in_d and not brief


def _d_wchans(p: ProcessFacts) -> list[tuple[int, str]]:
    """(tid, wchan) of its D-state threads; the process's own wchan when per-thread facts are missing."""
    per_thread = [
        (tid, chan)
        for tid, state, chan in zip(p.thread_ids, p.thread_states, p.thread_wchans, strict=False)
        if state == "D"
    ]
    if per_thread:
        return per_thread
    # without per-thread facts the process's wchan is its main thread's: right only if that one is in D
    return [(p.pid, p.wchan or "?" if p.state == "D" else "? (not gathered per thread)")]


def _classify(wchan: str) -> tuple[str, str]:
    for fragments, what, remedy in _WAITS:
        if any(f in wchan for f in fragments):
            return what, remedy
    return (
        "a kernel resource (see the wait channel)",
        "Read the kernel stack as root (`cat /proc/PID/task/TID/stack`) and `dmesg` to see what it waits for",
    )


def _since(p: ProcessFacts) -> str:
    return f" for {format_duration(p.state_for_s)}" if p.state_for_s is not None else ""


def _python_line(stack: ProcessStack | None, tid: int | None) -> list[str]:
    if stack is None:
        return []
    for thread in stack.threads:
        if thread.tid == tid and thread.frames:
            return [f"thread {tid} ({thread.name}) is at {frames.path_of(thread.frames, 3)}"]
    return []

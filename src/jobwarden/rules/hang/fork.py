"""`fork-deadlock`: a child forked while other threads ran waits on a lock one of them held.

fork() copies memory, locks included, but only the calling thread: a lock another thread held at that
instant is held forever in the child (docs/measurements.md, "Fork while a lock is held"; CPython gh-74580
for the interpreter's own locks, gh-112275 for HEAD_LOCK). The finding needs both halves:
- the process waits on a lock (`locks.lock_wait`);
- it was forked while other threads ran: a ForkRecord from the fork hook (the threads alive at the fork),
  or, without one, its own stack shows the fork (multiprocessing's `Popen._launch` in popen_fork.py, or the
  interpreter's after-fork code) and its parent runs other threads now.
In the wait-for graph (rules.hang.graph) that is one edge: a thread waits for a lock whose holder is a
thread this process does not have (it stayed in the parent at the fork), so nobody will release it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobwarden.config import counted
from jobwarden.model import Finding
from jobwarden.observations import ForkRecord, Frame, ProcessFacts, ProcessStack, ThreadStack
from jobwarden.rules import frames
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.hang import graph
from jobwarden.rules.hang.graph import Edge
from jobwarden.rules.hang.locks import LockWait, lock_wait
from jobwarden.rules.lookup import Lookup, describe

_RULE = "fork-deadlock"
_FORK_RECORD_SLACK_S = 2.0  # a record without child_pid matches a child started this close to it
_GENERIC = {"<module>", "run", "_bootstrap", "_bootstrap_inner", "main", "<lambda>"}
_PY312_WARNING = "use of fork() may lead to deadlocks in the child"


@dataclass(frozen=True)
class Origin:
    parent_pid: int | None
    site: tuple[Frame, ...]  # the forking thread's stack at the fork, innermost first
    threads: tuple[ThreadStack, ...]  # the other threads alive then (or, without a record, now)
    source: str  # where the evidence comes from, said in the finding
    site_forks: int = 1  # forks the parent made at that site beside other threads (the hook's count)


@dataclass(frozen=True)
class Stuck:
    stack: ProcessStack
    wait: LockWait
    origin: Origin


def fork_deadlock(ev: RunEvidence) -> Finding | None:
    return from_edges(ev, fork_edges(ev))


def fork_edges(ev: RunEvidence) -> list[Edge]:
    """The wait-for graph's edges of this signature: a thread that waits on a lock in a process forked
    while other threads ran, whose holder is one of those threads, absent from the child."""
    if ev.hang_window_s is None:
        return []
    look = Lookup.of(ev)
    edges = []
    for stack in look.live_stacks():
        stuck = _stuck(ev, look, stack)
        if stuck is not None:
            parent = stuck.origin.parent_pid
            on = (parent,) if parent is not None else ()
            at = stuck.wait.at
            thing = frames.where(at) if at else "native code"
            edges.append(Edge(stack.pid, stuck.wait.thread.tid, "lock", thing, on, "absent", at=at))
    return edges


def from_edges(ev: RunEvidence, edges: Sequence[Edge]) -> Finding | None:
    """`fork-deadlock` from the graph's edges: a lock wait whose holder is absent from the process."""
    if ev.hang_window_s is None:
        return None
    look = Lookup.of(ev)
    stuck = []
    for edge in edges:
        stack = look.stacks.get(edge.pid)
        if edge.kind != "lock" or edge.far != "absent" or stack is None:
            continue
        found = _stuck(ev, look, stack, edge.tid)
        if found is not None:
            stuck.append((found, edge))
    if not stuck:
        return None
    return _finding(ev, look, stuck)


def _stuck(ev: RunEvidence, look: Lookup, stack: ProcessStack, tid: int | None = None) -> Stuck | None:
    facts = look.processes.get(stack.pid)
    threads = [t for t in stack.threads if tid is None or t.tid == tid]
    waits = [w for t in threads if (w := lock_wait(t, facts, len(stack.threads))) is not None]
    if not waits:
        return None
    origin = _origin(ev, look, stack, facts, waits[0])
    return Stuck(stack, waits[0], origin) if origin is not None else None


def _origin(
    ev: RunEvidence, look: Lookup, stack: ProcessStack, facts: ProcessFacts | None, wait: LockWait
) -> Origin | None:
    record = _record_for(ev.forks, stack.pid, facts)
    if record is not None:
        if not record.threads:
            return None  # forked with no other thread alive: a lock wait there is not fork's doing
        source = "the fork hook's record"
        if not record.exact:  # the hooks record a site's first forks in full, then only count them
            source = "the fork hook's record of that site; threads as at its first recorded forks"
        return Origin(record.parent_pid, record.stack, record.threads, source, record.site_forks)
    ppid = facts.ppid if facts else None
    if wait.after_fork:
        return Origin(ppid, _below_fork(wait.thread), (), "its own stack, inside the interpreter's fork code")
    parent = look.stacks.get(ppid) if ppid is not None else None
    if ppid is None or parent is None or len(parent.threads) < 2:
        return None
    # The child's thread carries the name of the parent thread that forked it (py-spy reads it from the
    # copied threading state), so the parent's other threads are the ones that vanished in the child.
    others = tuple(t for t in parent.threads if t.name != wait.thread.name)
    site = _mp_fork_site(wait.thread)
    if site:
        return Origin(ppid, site, others, f"its stack (multiprocessing's fork) and pid {ppid}'s threads now")
    parent_facts = look.processes.get(ppid)
    if facts is not None and parent_facts is not None and facts.cmdline == parent_facts.cmdline:
        # fork() without exec: same command line as the parent; the stack no longer shows the fork
        source = f"its command line, the same as pid {ppid}'s, and pid {ppid}'s threads now"
        return Origin(ppid, (), others, source)
    return None


def _record_for(forks: Sequence[ForkRecord], pid: int, facts: ProcessFacts | None) -> ForkRecord | None:
    for record in forks:
        if record.child_pid == pid:
            return record
    if facts is None or facts.started_at is None:
        return None
    # A child that hung before it could report in: the parent's record made as the child started.
    candidates = [
        r
        for r in forks
        if r.child_pid is None
        and r.parent_pid == facts.ppid
        and abs(r.at - facts.started_at) <= _FORK_RECORD_SLACK_S
    ]
    return min(candidates, key=lambda r: abs(r.at - (facts.started_at or 0.0)), default=None)


def _mp_fork_site(thread: ThreadStack) -> tuple[Frame, ...]:
    """multiprocessing's fork as seen from the child: the frames from `Popen._launch` outwards."""
    py = frames.python_frames(thread)
    for i, frame in enumerate(py):
        if frames.is_in(frame, "multiprocessing/popen_fork.py") and frames.name(frame) == "_launch":
            return tuple(py[i:])
    return ()


def _below_fork(thread: ThreadStack) -> tuple[Frame, ...]:
    return tuple(frames.python_frames(thread))


# --- the finding ------------------------------------------------------------------------------------


def _finding(ev: RunEvidence, look: Lookup, found: list[tuple[Stuck, Edge]]) -> Finding:
    stuck = [s for s, _ in found]
    first, edge = found[0]
    pid = first.stack.pid
    origin = first.origin
    parent = f"pid {origin.parent_pid}" if origin.parent_pid is not None else "its parent"
    alive = len(origin.threads)
    evidence = [
        f"{describe(pid, look.cmdline(pid))} waits on a lock at "
        f"{frames.where(first.wait.at) if first.wait.at else 'native code'} ({first.wait.how})",
        *_state_line(look.processes.get(pid)),
        f"forked by {parent} at {_site_text(origin.site)} (from {origin.source})",
        *_site_forks_lines(parent, origin),
        *_threads_lines(origin.threads, first.wait),
        *_warning_lines(ev.log_tail),
        *_request_lines(ev, origin),
    ]
    if len(stuck) > 1:
        others = ", ".join(str(s.stack.pid) for s in stuck[1:])
        evidence.append(f"{len(stuck) - 1} more process(es) stuck the same way: pid {others}")
    steps = graph.lead_in(ev.pid, ev.waits, pid)
    end = f"that thread does not exist in pid {pid}: nobody will ever release the lock"
    evidence.append(graph.chain_line(steps, edge, lambda p: describe(p, look.cmdline(p), 40), end))
    if first.wait.after_fork:
        summary = (
            f"pid {pid} hangs inside CPython's own after-fork code, waiting on an interpreter lock that "
            f"another thread of {parent} held at the fork (CPython gh-112275); it will never continue."
        )
    else:
        summary = (
            f"pid {pid} was forked from {parent} while {_other_threads(alive)} ran, and waits on a lock held "
            "at that instant by a thread that does not exist in the child, so the lock is never released."
        )
    return Finding(
        _RULE,
        f"Fork deadlock: pid {pid} waits forever on a lock copied held by fork()",
        summary,
        "critical",
        tuple(evidence),
        _remedy(ev, origin, first.wait),
        tuple(s.stack.pid for s in stuck),
    )


def _site_forks_lines(parent: str, origin: Origin) -> list[str]:
    if origin.site_forks < 2:
        return []
    return [f"{parent} forked at least {origin.site_forks} times there while other threads ran"]


def _other_threads(n: int) -> str:
    if n == 0:
        return "other threads"
    return "1 other thread" if n == 1 else f"{n} other threads"


def _state_line(facts: ProcessFacts | None) -> list[str]:
    if facts is None:
        return []
    threads = len(facts.thread_states) or 1
    return [f"state {facts.state}, wchan {facts.wchan or '?'}, {counted(threads, 'thread')}"]


def _site_text(site: Sequence[Frame]) -> str:
    if not site:
        return "a site the stacks no longer show"
    user = next((f for f in site if not frames.is_library(f)), None)
    inner = frames.where(site[0])
    if user is None or user is site[0]:
        return inner
    return f"{inner}, called from {frames.where(user)}"


def _threads_lines(threads: Sequence[ThreadStack], wait: LockWait) -> list[str]:
    if not threads:
        return []
    lines = [
        "threads alive at the fork: "
        + "; ".join(f"{frames.thread_label(t)} in {_where_thread(t)}" for t in threads[:8])
    ]
    holder = _likely_holder(threads, wait)
    if holder is not None:
        lines.append(holder)
    return lines


def _where_thread(thread: ThreadStack) -> str:
    site = frames.call_site(thread) or next(iter(frames.python_frames(thread)), None)
    return frames.where(site) if site else "native code"


def _likely_holder(threads: Sequence[ThreadStack], wait: LockWait) -> str | None:
    """A thread that was running the code the child now waits in held its lock; failing that, a lone other
    thread is the only candidate."""
    waiting = {(f.file, frames.name(f)) for f in frames.python_frames(wait.thread)}
    waiting -= {(file, fn) for file, fn in waiting if fn in _GENERIC}
    for thread in threads:
        shared = [f for f in frames.python_frames(thread) if (f.file, frames.name(f)) in waiting]
        if shared:
            return (
                f"{frames.thread_label(thread)} was inside {frames.where(shared[0])} at the fork, the code "
                "the child waits in: the likely holder of the lock"
            )
    if len(threads) == 1:
        return f"{frames.thread_label(threads[0])} was the only other thread alive: the likely holder"
    return None


def _request_lines(ev: RunEvidence, origin: Origin) -> list[str]:
    multiprocessing = any(frames.is_in(f, "multiprocessing/popen_fork.py") for f in origin.site)
    request = _explicit_fork(ev, origin.parent_pid) if multiprocessing else None
    return [f"the fork start method was asked for by name: {request[0]} at {request[1]}"] if request else []


def _warning_lines(log_tail: Sequence[str]) -> list[str]:
    hits = [line.strip() for line in log_tail if _PY312_WARNING in line]
    return [f"output: {hits[-1]}"] if hits else []


def _remedy(ev: RunEvidence, origin: Origin, wait: LockWait) -> str:
    kill = "The stuck child cannot recover: kill it (or restart the job)."
    forkserver = (
        f"--mp-start {ev.mp_start} was in force: "
        if ev.mp_start
        else "`jobwarden run --mp-start forkserver` "
    )
    if wait.after_fork:
        return (
            f"{kill} This is an interpreter bug (CPython gh-112275, fixed by GH-112336): upgrade Python to a "
            "release with the fix, and avoid forking while threads start or exit"
            + (
                "."
                if ev.mp_start
                else f"; {forkserver}keeps multiprocessing from forking the threaded process."
            )
        )
    multiprocessing = any(frames.is_in(f, "multiprocessing/popen_fork.py") for f in origin.site)
    request = _explicit_fork(ev, origin.parent_pid) if multiprocessing else None
    if request is not None:
        api, site = request
        fix = (
            f"The code asks for the fork start method by name ({api} at {site}), which --mp-start cannot "
            f"change: ask for 'forkserver' (or 'spawn') there instead: {api.replace('fork', 'forkserver')}."
        )
    elif multiprocessing and ev.mp_start:
        fix = (
            f"--mp-start {ev.mp_start} was in force, yet multiprocessing forked this child: a library chose "
            "the fork context itself (see the fork site above); give it a forkserver or spawn context "
            "(mp_context= for ProcessPoolExecutor, multiprocessing_context= for DataLoader)."
        )
    elif multiprocessing:
        fix = (
            "Do not fork a process that runs threads: `jobwarden run --mp-start forkserver` (or spawn) fixes "
            "it without a code change; in code, call multiprocessing.set_start_method('forkserver') at the "
            "entry point (or pass mp_context=multiprocessing.get_context('forkserver') to "
            "ProcessPoolExecutor / multiprocessing_context= to DataLoader)."
        )
    else:
        fix = (
            "Do not call os.fork() in a process that runs threads: start the child with subprocess or "
            "multiprocessing's forkserver/spawn context instead (--mp-start does not reach a bare os.fork)."
        )
    return (
        f"{kill} {fix} Otherwise start threads (logging handlers, progress bars, metrics or gRPC clients) "
        "only after the children exist. Python 3.12+ warns about this ('This process is multi-threaded, use "
        "of fork() may lead to deadlocks in the child', DeprecationWarning), and 3.14 makes forkserver the "
        "default on Linux."
    )


def _explicit_fork(ev: RunEvidence, parent: int | None) -> tuple[str, str] | None:
    """("get_context('fork')", 'demo/deadlock.py:29') where the forking process asked for the fork start
    method by name (the hooks' record), newest first; None when it used the default."""
    for request in reversed(ev.fork_requests):
        if parent is not None and request.pid != parent:
            continue
        inside = [f for f in request.stack if "/multiprocessing/" in f.file]
        outside = [f for f in request.stack if "/multiprocessing/" not in f.file]
        if not outside:
            continue
        called = frames.name(inside[-1]) if inside else "get_context"
        api = "set_start_method('fork')" if called.endswith("set_start_method") else "get_context('fork')"
        user = next((f for f in outside if not frames.is_library(f)), outside[0])
        site = f"{user.file}:{user.line}"
        if user is not outside[0]:  # a library asked, on the user's behalf
            site = f"{frames.where(outside[0])}, called from {site}"
        return api, site
    return None

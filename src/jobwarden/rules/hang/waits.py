"""`wait-chain`: the run is hung, and the kernel says what it waits for, and who for.

From the main process's waits (probes.waits: a child it waits for, a file lock, a pipe's other end), the
rule follows each wait to the process on its other side, and that one's wait, to the end: the process
everything waits for (a lock's holder outside the job, a writer that keeps a pipe open and writes
nothing), or back to a process already on the path (a deadlock). That last process is the finding's
first pid. A main process the kernel shows waiting on nothing it can name (a futex, a socket, a sleep)
leaves the run to the other hang rules and to `no-progress`, unless threads of the process that chain
ends at (or of another) wait for each other's Python locks, as their stacks and source show
(hang.lockcycle): a deadlock, that process first. The edges and their walk are hang.graph's, shared
with the hang signatures, which are said by their own ids first: this rule says the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobwarden.model import Finding
from jobwarden.observations import ThreadStack, Wait
from jobwarden.rules import frames
from jobwarden.rules.evidence import RunEvidence, job_ref
from jobwarden.rules.hang import feeds
from jobwarden.rules.hang.feeds import EDGES, FeedChain, FeedGraph
from jobwarden.rules.hang.graph import Chain, Edge, Names, Step, follow, pipe, what
from jobwarden.rules.hang.lockcycle import (
    cycle_evidence,
    cycle_remedy,
    cycle_summary,
    cycle_title,
    lock_cycles,
    thread_name,
)
from jobwarden.rules.hang.rlockchain import (
    chain_evidence,
    chain_words,
    doing,
    holder_words,
    lock_words,
    rlock_chains,
)
from jobwarden.rules.lookup import Lookup, describe

_EDGES = EDGES  # a wait with another process on its far side


def wait_chain(ev: RunEvidence) -> Finding | None:
    if ev.hang_window_s is None or ev.pid is None:
        return None
    chain = follow(ev.pid, ev.waits)
    name = Names(Lookup.of(ev), ev.wait_parties)
    graph = FeedGraph(ev.stacks, ev.feed_sites, ev.waits, ev.deaths, ev.processes)
    fed = _fed_at(chain, graph) if chain is not None else None
    if chain is not None and fed is not None:
        n, feeds_chain, queue_pipe = fed
        found = _fed(ev, chain.steps[:n], feeds_chain, name)
        if found is not None or queue_pipe:  # a queue's pipe is the queue: its words or none
            return found
    rlocked = _rlock_chain(ev, chain, name)
    if rlocked is not None:
        return rlocked
    if chain is None or not _explains(chain, ev.waits):
        prefix = chain.steps if chain is not None else ()
        end = chain.end if chain is not None else ev.pid
        return (
            _lock_cycle(ev, chain, name)
            or _fed(ev, prefix, graph.follow(end), name)
            or (_fed(ev, (), graph.follow(ev.pid), name) if end != ev.pid else None)
        )
    return Finding(
        "wait-chain",
        _title(chain, name),
        _summary(chain, name, ev.waits),
        "error",
        tuple(_evidence(chain, name, ev.waits)),
        _remedy(chain, name, job_ref(ev)),
        tuple(dict.fromkeys([chain.end, *(s.wait.pid for s in chain.steps)])),
    )


def _lock_cycle(ev: RunEvidence, chain: Chain | None, name: Names) -> Finding | None:
    """Threads waiting for each other's Python locks (hang.lockcycle), in the process the main one's
    chain of children ends at, else the main process, else another: that process first."""
    cycles = lock_cycles(ev.stacks, ev.lock_sites) if ev.lock_sites else []
    if not cycles:
        return None
    end = chain.end if chain is not None else ev.pid
    cycle = min(cycles, key=lambda c: (c.pid != end, c.pid != ev.pid, c.pid))
    summary = f"In {name.of(cycle.pid)}, " + cycle_summary(cycle) + "."
    pids = [cycle.pid]
    if chain is not None and chain.end == cycle.pid:
        steps = ", ".join(f"{name.of(s.wait.pid)} {what(s, name)}" for s in chain.steps)
        summary = f"{_capitalised(steps)}. {summary}"
        pids += [s.wait.pid for s in chain.steps]
    return Finding(
        "wait-chain",
        cycle_title(cycle),
        summary,
        "error",
        tuple(cycle_evidence(cycle)),
        cycle_remedy(cycle, job_ref(ev)),
        tuple(dict.fromkeys(pids)),
    )


def _rlock_chain(ev: RunEvidence, chain: Chain | None, name: Names) -> Finding | None:
    """Threads waiting for RLocks whose owners Python records (hang.rlockchain), in a process of the
    kernel's chain (the earliest), else the main process, else another: who holds each, and on through
    what the last holder waits for in the kernel (a pipe, a child, a file lock) to the process everything
    waits for, which is the finding's first pid."""
    found = rlock_chains(ev.stacks, ev.lock_sites) if ev.lock_sites else []
    if not found:
        return None
    path = [ev.pid, *(s.to for s in chain.steps)] if chain is not None else [ev.pid]
    locks = min(found, key=lambda c: (path.index(c.pid) if c.pid in path else len(path), c.pid))
    if locks.pid not in path and chain is not None and _explains(chain, ev.waits):
        return None  # the kernel's chain explains the hang: threads of a process off it are another story
    prefix = []
    for step in chain.steps if chain is not None and locks.pid in path else ():
        if step.wait.pid == locks.pid:
            break
        prefix.append(step)
    parts = [f"{name.of(s.wait.pid)} {what(s, name)}" for s in prefix]
    parts.append(
        f"in which {chain_words(locks)}" if prefix else f"in {name.of(locks.pid)}, {chain_words(locks)}"
    )
    first = locks.steps[0]
    title = f"{_capitalised(thread_name(first.thread))} of pid {locks.pid} waits for {lock_words(first)}"
    evidence = chain_evidence(locks)
    firsts = [locks.pid]
    remedy = _RLOCK_REMEDY.replace("{job}", job_ref(ev))
    if locks.cycle:
        title = f"Deadlock: {len(locks.steps)} threads of pid {locks.pid} wait for each other's RLocks"
        summary = f"{_capitalised(', '.join(parts))}: a cycle, nobody can go on (a deadlock)."
    else:
        holder = locks.holder
        title += f" held by {holder_words(locks.steps[-1])}"
        own = [w for w in ev.waits if holder is not None and w.pid == locks.pid and w.tid == holder.tid]
        edge = next((w for w in own if w.kind in _EDGES and w.on), None)
        onward = follow(locks.pid, ev.waits, first=edge) if edge is not None else None
        if onward is not None and _explains(onward, ev.waits):
            then = ", ".join(f"which {what(s, name)}" for s in onward.steps)
            title += f", which {what(onward.steps[-1], name, short=True)}"
            ends = f"pid {onward.end} {_doing(onward.end, ev.waits)}: everything waits for it"
            summary = f"{_capitalised(', '.join(parts))}, {then}" + (
                ": a cycle, nobody can go on." if onward.cycle else f"; {ends}."
            )
            evidence += _evidence(onward, name, ev.waits)
            remedy = f"{_remedy(onward, name, job_ref(ev))} {_RLOCK_HELD}"
            firsts = [onward.end, *(s.wait.pid for s in onward.steps)]
        elif holder is not None:
            sleeping = any(w.kind == "sleep" for w in own)
            title += ", which sleeps" if sleeping else ""
            summary = f"{_capitalised(', '.join(parts))}, which {doing(holder, sleeping)}."
        else:
            summary = f"{_capitalised(', '.join(parts))}."
    return Finding(
        "wait-chain",
        title,
        summary,
        "error",
        tuple(evidence),
        remedy,
        tuple(dict.fromkeys([*firsts, locks.pid, *(s.wait.pid for s in prefix)])),
    )


_RLOCK_HELD = "A thread holds an RLock while it waits for something else: release it before waiting."
_RLOCK_REMEDY = (
    f"{_RLOCK_HELD[:-1]} (or wait with a timeout), take several locks in one order everywhere, and take"
    " a lock with a timeout"
    " (`lock.acquire(timeout=...)`) so a held lock fails the job instead of hanging it. Restart the job to"
    " get it moving (`jobwarden stop {job}`, then `jobwarden resume {job}`)."
)


def _fed_at(chain: Chain, graph: FeedGraph) -> tuple[int, FeedChain | None, bool] | None:
    """The first step of the kernel's chain whose process waits on a queue, an event or a condition the
    source names, and the chain of feeders from there: the source says more than the kernel. A thread
    reading the pipe of a multiprocessing queue is that queue's wait, said or not (the last of the three):
    a live producer that only sleeps is no hang signature."""
    for n, step in enumerate(chain.steps):
        w = step.wait
        own_pipe = w.kind == "pipe-read" and bool(graph.waiting(w.pid, w.tid))
        fed = graph.follow(w.pid, w.tid if own_pipe else None)
        if fed is not None or own_pipe:
            return n, fed, own_pipe
    return None


def _fed(ev: RunEvidence, prefix: Sequence[Step], fed: FeedChain | None, name: Names) -> Finding | None:
    """A thread waiting on a queue, an event or a condition (hang.feeds), after the kernel's steps that
    lead to its process (`prefix`: a parent waiting for its child): who would feed it, and where that
    ends. Said only where it ends: nothing feeds it any more, a cycle, or a kernel chain that explains."""
    if fed is None:
        return None
    onward = None
    if fed.end == "kernel" and fed.feeder is not None and fed.onward is not None:
        onward = follow(fed.feeder[0], ev.waits, first=fed.onward)
        if onward is None or not _explains(onward, ev.waits):
            return None
    first = fed.steps[0]
    parts = [f"{name.of(s.wait.pid)} {what(s, name)}" for s in prefix]
    parts.append(f"{_thread(first.pid, first.thread)} {feeds.waits_on(first)}")
    parts += [
        f"{feeds.fed_by(before.site)} {_thread(s.pid, s.thread)}, which {feeds.waits_on(s)}"
        for before, s in zip(fed.steps, fed.steps[1:], strict=False)
    ]
    said = _Said(
        f"{_capitalised(_thread(first.pid, first.thread))} {feeds.waits_on(first)}",
        _capitalised(", ".join(parts)),
        [_feed_evidence(s) for s in fed.steps],
    )
    if fed.end == "cycle":
        firsts = _fed_cycle(fed, said)
    elif onward is not None:
        firsts = _fed_onward(ev, fed, onward, name, said)
    else:
        firsts = _fed_gone(ev, fed, name, said)
    waiters = [s.pid for s in fed.steps] + [s.wait.pid for s in prefix]
    return Finding(
        "wait-chain",
        said.title,
        said.summary,
        "error",
        tuple(said.evidence),
        said.remedy.replace("{job}", job_ref(ev)),
        tuple(dict.fromkeys([*firsts, *waiters])),
    )


@dataclass
class _Said:
    """A fed chain's finding as it is written: the first waiter's words, then how the chain ends."""

    title: str
    summary: str
    evidence: list[str]
    remedy: str = ""


def _fed_cycle(fed: FeedChain, said: _Said) -> list[int]:
    first = fed.steps[0]
    things = ", ".join(f"{s.site.kind} {s.site.name}" for s in fed.steps)
    pids = sorted({s.pid for s in fed.steps})
    where = f" of pid {pids[0]}" if len(pids) == 1 else ""
    said.title = f"Deadlock: {len(fed.steps)} threads{where} wait for each other ({things})"
    closes = f"{feeds.fed_by(fed.last.site)} {_thread(first.pid, first.thread)}"
    said.summary += f", {closes}: a cycle, nobody can go on."
    said.remedy = _FEED_REMEDIES["cycle"]
    return [first.pid]


def _fed_onward(ev: RunEvidence, fed: FeedChain, onward: Chain, name: Names, said: _Said) -> list[int]:
    """The feeder waits on the kernel's side: the chain goes on through the kernel's steps."""
    assert fed.feeder is not None
    q, feeder = fed.feeder
    by = f"{feeds.fed_by(fed.last.site)} {_thread(q, feeder)}"
    then = ", ".join(f"which {what(s, name)}" for s in onward.steps)
    said.title += f", {by}, which {what(onward.steps[-1], name, short=True)}"
    ends = f"pid {onward.end} {_doing(onward.end, ev.waits)}: everything waits for it"
    said.summary += f", {by}, {then}" + (": a cycle, nobody can go on." if onward.cycle else f"; {ends}.")
    said.evidence += _evidence(onward, name, ev.waits)
    said.remedy = _remedy(onward, name, "{job}")
    return [onward.end, q, *(s.wait.pid for s in onward.steps)]


def _fed_gone(ev: RunEvidence, fed: FeedChain, name: Names, said: _Said) -> list[int]:
    """Nothing feeds it any more: the thread that did ended, the process that did died, or none does."""
    end = feeds.feeders_words(fed)
    said.title += f"; {end}"
    said.summary += f"; {end}."
    said.evidence += [f"{describe(d.pid, d.cmdline, 80)} {feeds.death_words(d)}" for d in fed.dead]
    output = feeds.ended_in_output(fed, ev.log_tail) if fed.end == "ended" else ""
    said.evidence += [f"the output: {output}"] if output else []
    said.remedy = _FEED_REMEDIES["task" if fed.end == "ended" and feeds.by_tasks(fed) else fed.end]
    return [fed.dead[0].pid if fed.dead else fed.last.pid]


def _thread(pid: int, thread: ThreadStack) -> str:
    return feeds.thread_words(pid, thread)


def _feed_evidence(step: feeds.FeedStep) -> str:
    site = step.site
    feeders = feeds.feeder_source(site) or "none in the file"
    made = f"{frames.short_file(site.made_in)}:{site.defined}" if site.made_in else f"line {site.defined}"
    return (
        f"pid {step.pid} {thread_name(step.thread)} is idle at {frames.where(step.at)}, waiting on "
        f"{feeds.kind_words(site)} {site.name} (made at {made}); the code that feeds it: "
        f"{feeders}"
    )


_RESTART = " Restart the job to get it moving (`jobwarden stop {job}`, then `jobwarden resume {job}`)."
_FEED_REMEDIES = {
    "unfed": "Nothing in the file ever feeds what the thread waits on: put into it (or set it) where the"
    " work is done, or wait with a timeout (`get(timeout=...)`, `wait(timeout)`) so a missing producer fails"
    " the job instead of hanging it." + _RESTART,
    "ended": "The thread that fed it ended (an exception it raised is in the output): catch errors in the"
    " producer and hand them to the consumer through the queue (or set the event in a `finally:`), and give"
    " the consumer a timeout so a lost producer fails the job instead of hanging it." + _RESTART,
    "died": "The process that fed it is gone: a consumer of a multiprocessing queue should watch its"
    " producers (`multiprocessing.connection.wait` on their `sentinel`s, `is_alive()`) or get with a"
    " timeout, so a dead producer fails the job instead of hanging it." + _RESTART,
    "task": "The task that fed it ended: an exception it raised is kept in its Future, shown only when"
    " `result()` is called: call it (or `concurrent.futures.wait` the futures) so a failed producer fails the"
    " job, and give the consumer a timeout so a lost producer fails it instead of hanging it." + _RESTART,
    "cycle": "Each thread waits for what the next one feeds: feed before waiting, or wait with a timeout."
    + _RESTART,
}


def _explains(chain: Chain, waits: Sequence[Wait]) -> bool:
    """The chain says more than "a wrapper waits for its child": it goes through a lock, a pipe or a
    connection, back to itself, or ends at a process that sleeps. A chain of children ending in a
    process stuck where the kernel names no far side (a futex, Python's own locks) is left to
    `no-progress`, whose stacks say where that process is."""
    if chain.cycle or any(s.wait.kind != "child" for s in chain.steps):
        return True
    return any(w.pid == chain.end and w.kind == "sleep" for w in waits)


def _title(chain: Chain, name: Names) -> str:
    loop = _loop(chain)
    if chain.cycle and len({s.wait.pid for s in loop}) > 1:
        things = ", ".join(dict.fromkeys(_thing(s.wait) for s in loop))
        return f"Deadlock: {len({s.wait.pid for s in loop})} processes wait for each other ({things})"
    last = chain.steps[-1]
    return _capitalised(what(last, name, short=True))


def _loop(chain: Chain) -> tuple[Step, ...]:
    """A cycle's own steps: those from the process it closes on (a parent waiting for a child in it is
    on the path, not in the cycle)."""
    if not chain.cycle:
        return ()
    first = next(n for n, s in enumerate(chain.steps) if s.wait.pid == chain.end)
    return chain.steps[first:]


def _thing(wait: Edge) -> str:
    """What a wait is on, in a few words: 'a file lock on /data/cache.lock', 'a pipe', 'child pid 812'."""
    if wait.kind == "file-lock":
        return f"a file lock on {wait.thing}"
    if wait.kind in ("pipe-read", "pipe-write"):
        return pipe(wait, "a pipe", "the FIFO")
    return wait.thing


def _summary(chain: Chain, name: Names, waits: Sequence[Wait]) -> str:
    first = chain.steps[0]
    parts = [f"{name.of(first.wait.pid)} {what(first, name)}"]
    parts += [f"which {what(s, name)}" for s in chain.steps[1:]]
    text = ", ".join(parts)
    if chain.cycle:
        return f"{_capitalised(text)}: a cycle, nobody can go on (a deadlock)."
    end = chain.end
    doing = _doing(end, waits)
    return f"{_capitalised(text)}; pid {end} {doing}: everything waits for it."


def _doing(pid: int, waits: Sequence[Wait]) -> str:
    own = [w for w in waits if w.pid == pid]
    sleeping = next((w for w in own if w.kind == "sleep"), None)
    if sleeping is not None:
        return "sleeps"
    if own:
        return f"waits in {own[0].call}"
    return "is not waiting on any of these"


def _evidence(chain: Chain, name: Names, waits: Sequence[Wait]) -> list[str]:
    lines = []
    for s in chain.steps:
        w = s.wait
        thread = "" if w.tid == w.pid else f" (thread {w.tid})"
        lines.append(
            f"pid {w.pid}{thread} is blocked in {w.call}() on {w.thing}; the far side: {name.of(s.to)}"
        )
    if not chain.cycle:
        lines.append(f"{name.of(chain.end)}{name.whose(chain.end)} {_end_state(chain.end, waits)}")
    return lines


def _end_state(pid: int, waits: Sequence[Wait]) -> str:
    own = next((w for w in waits if w.pid == pid), None)
    if own is None:
        return "is in no wait jobwarden reads (running, or waiting on a futex or a socket)"
    if own.kind == "sleep":
        return f"sleeps ({own.call})"
    return f"is blocked in {own.call}() on {own.thing}"


def _remedy(chain: Chain, name: Names, job: str) -> str:
    end, last = chain.end, chain.steps[-1]
    if chain.cycle:
        return (
            "Each process above waits for the next: break the cycle (take locks in one order, close the "
            "pipe ends a process does not use, never wait for a child that waits for you); restart the job "
            f"to get it moving (`jobwarden stop {job}`, then `jobwarden resume {job}`)."
        )
    if last.wait.kind == "file-lock":
        return (
            f"Find out why pid {end} holds the lock (`ps -o pid,user,etime,args -p {end}`): end it if it is "
            "stale, or give the job a lock file of its own; take the lock with a timeout (flock -w, "
            "fcntl with LOCK_NB in a retry loop) so a held lock fails the job instead of hanging it."
        )
    if last.wait.kind == "pipe-read":
        return (
            f"The reader gets end-of-file only once every write end is closed, and pid {end} keeps one open "
            "without writing: end it when its work is done, or start it with its output elsewhere "
            "(subprocess close_fds, `cmd > /dev/null &` in a script)."
        )
    if last.wait.kind == "socket-read":
        return (
            f"pid {end} holds the other end of the connection and sends nothing: look at what it waits "
            f"for (`jobwarden dump {job}` for the job's side, py-spy dump --pid {end} for its own); give "
            "the client a timeout (socket.settimeout, requests' timeout=) so a silent server fails the "
            "job instead of hanging it."
        )
    if last.wait.kind == "pipe-write":
        return (
            f"pid {end} holds the pipe's read end but does not read: drain the pipe (subprocess "
            "communicate() instead of wait(), or read stdout and stderr in threads)."
        )
    return f"Look at what pid {end} is doing: `jobwarden dump {job}` takes fresh stacks of every process."


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]

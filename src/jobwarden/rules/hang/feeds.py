"""A thread that waits on a queue, an event or a condition, and who would feed it.

The kernel shows a futex (a `queue.Queue`, a `threading.Event`) or a pipe (a `multiprocessing.Queue`),
never who is to put into it; probes.feeds reads the job's source for the object's name and the functions
that feed it (`FeedSite`), and the stacks say which threads and processes run those functions now:

- none does, and none can any more: nothing in the file feeds it, or every function that does runs only
  as a thread's or a process's `target=` that no live thread is placed to start again: the thread
  that fed it ended, or the process that did died (the job's dead children, named first);
- one does and waits itself, without a timeout: on another such object (the chain goes on, a cycle is a
  deadlock), or on the kernel's side (a pipe, a lock, a child: rules.hang.waits follows it);
- one does and runs, sleeps, or waits on what no rule can name: it may still feed it, so nothing is said
  (a worker pool idling on its task queue, a server thread on its stop event).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobwarden.observations import (
    Feeder,
    FeedSite,
    Frame,
    ProcessDeath,
    ProcessFacts,
    ProcessStack,
    ThreadStack,
    Wait,
)
from jobwarden.rules import frames
from jobwarden.rules.hang.graph import KERNEL_KINDS

EDGES = KERNEL_KINDS  # a kernel wait with a far side
_VERBS = {"queue": "puts into", "event": "sets", "condition": "notifies"}
# where a thread waiting on such an object sits, between the wait and the job's own call (probes.feeds)
_WAIT_LIBRARY = (
    "/threading.py",
    "/queue.py",
    "multiprocessing/queues.py",
    "multiprocessing/synchronize.py",
    "multiprocessing/connection.py",
)


@dataclass(frozen=True)
class FeedStep:
    pid: int
    thread: ThreadStack
    at: Frame  # the job's line that waits
    site: FeedSite


@dataclass(frozen=True)
class FeedChain:
    steps: tuple[FeedStep, ...]
    end: str  # "cycle", "unfed" (nothing feeds it), "ended" (its threads ended), "died", "kernel"
    feeder: tuple[int, ThreadStack] | None = None  # the feeder thread whose own wait goes on ("kernel")
    onward: Wait | None = None  # that thread's kernel wait
    dead: tuple[ProcessDeath, ...] = ()  # "died": the job's processes that ran it, dead

    @property
    def last(self) -> FeedStep:
        return self.steps[-1]


class FeedGraph:
    """The job's threads that wait on fed objects, and the threads and processes that feed them."""

    def __init__(
        self,
        stacks: Sequence[ProcessStack],
        sites: Mapping[tuple[str, int], FeedSite],
        waits: Sequence[Wait],
        deaths: Sequence[ProcessDeath],
        live: Sequence[ProcessFacts] = (),
    ) -> None:
        self.stacks = {s.pid: s for s in stacks if s.threads}
        self.sites, self.waits, self.deaths = sites, waits, deaths
        # a live Python process whose stacks are missing may be the one that feeds a multiprocessing object
        self.unseen = any(p.is_python and p.pid not in self.stacks for p in live)

    def waiting(self, pid: int, tid: int | None = None) -> list[tuple[ThreadStack, Frame, FeedSite]]:
        """The threads of `pid` (or its thread `tid`) idle in a wait on a fed object, main thread first."""
        ps = self.stacks.get(pid)
        if ps is None or not self.sites:
            return []
        found = []
        for thread in sorted(ps.threads, key=lambda t: (t.tid != pid, t.tid or 0)):
            if thread.active is not False or (tid is not None and thread.tid != tid):
                continue
            py = frames.python_frames(thread)
            at = next((f for f in py if not f.file.endswith(_WAIT_LIBRARY)), None)
            if not py or not py[0].file.endswith(_WAIT_LIBRARY) or at is None:
                continue
            site = self.sites.get((at.file, at.line or 0))
            if site is not None:
                found.append((thread, at, site))
        return found

    def follow(self, pid: int, tid: int | None = None) -> FeedChain | None:
        """From the first waiting thread of `pid` (or its thread `tid`) whose chain ends somewhere said."""
        for thread, at, site in self.waiting(pid, tid):
            chain = self._from([], pid, thread, at, site)
            if chain is not None:
                return chain
        return None

    def _from(
        self, steps: list[FeedStep], pid: int, thread: ThreadStack, at: Frame, site: FeedSite
    ) -> FeedChain | None:
        steps = [*steps, FeedStep(pid, thread, at, site)]
        if site.feeders is None:
            return None
        live = self._feeding(pid, thread, site)
        if not live:
            return self._gone(steps, pid, thread, site)
        if any(t.active is not False for _, t in live):
            return None  # a feeder works: it may feed it yet
        q, feeder = live[0]
        if any(s.pid == q and s.thread.tid == feeder.tid for s in steps):
            return FeedChain(tuple(steps), "cycle")
        nxt = self.waiting(q, feeder.tid)
        if nxt:
            return self._from(steps, q, *nxt[0])
        onward = next(
            (w for w in self.waits if w.pid == q and w.tid == feeder.tid and w.kind in EDGES and w.on), None
        )
        return FeedChain(tuple(steps), "kernel", (q, feeder), onward) if onward else None

    def _feeding(self, pid: int, waiter: ThreadStack, site: FeedSite) -> list[tuple[int, ThreadStack]]:
        """The live threads (of `pid`, or of any process for multiprocessing's objects) inside a function
        that feeds the object, the waiter aside; lowest pid and thread first."""
        pids = [pid] if site.across == "threads" else sorted(self.stacks)
        found = []
        for p in pids:
            for thread in self.stacks[p].threads if p in self.stacks else ():
                if thread is not waiter and any(
                    _inside(f, site, d) for d in site.feeders or () for f in thread.frames
                ):
                    found.append((p, thread))
        return sorted(found, key=lambda x: (x[0], x[1].tid or 0))

    def _gone(self, steps: list[FeedStep], pid: int, waiter: ThreadStack, site: FeedSite) -> FeedChain | None:
        """Nothing runs a feeder now; said only when nothing can start one again."""
        if not site.feeders:
            return FeedChain(tuple(steps), "unfed")
        if not all(f.only_started and f.starts for f in site.feeders):
            return None
        if site.across == "processes" and self.unseen:
            return None
        pids = [pid] if site.across == "threads" else sorted(self.stacks)
        for p in pids:
            for thread in self.stacks[p].threads if p in self.stacks else ():
                if thread is not waiter and any(
                    _in_scope(f, d.file or site.file, s.scope, s.first, s.last)
                    for d in site.feeders
                    for s in d.starts
                    for f in thread.frames
                ):
                    return None  # a live thread stands where a feeder is started: it may start one
        kinds = {s.kind for d in site.feeders for s in d.starts}
        if kinds == {"process"}:
            dead = tuple(
                d for d in self.deaths if d.ppid == pid and not d.is_main and d.pid not in self.stacks
            )
            return FeedChain(
                tuple(steps), "died", dead=tuple(sorted(dead, key=lambda d: (not d.abnormal, d.at)))
            )
        return FeedChain(tuple(steps), "ended")


def _inside(frame: Frame, site: FeedSite, feeder: Feeder) -> bool:
    return _in_scope(frame, feeder.file or site.file, feeder.function, feeder.first, feeder.last)


def _in_scope(frame: Frame, file: str, function: str, first: int, last: int) -> bool:
    return (
        not frame.native
        and frame.file == file
        and frames.name(frame) == function
        and first <= (frame.line or 0) <= last
    )


# --- words ------------------------------------------------------------------------------------------


def thread_words(pid: int, thread: ThreadStack) -> str:
    """'thread "MainThread" of pid 812'."""
    label = f'thread "{thread.name}"' if thread.name else f"thread {thread.tid}"
    return f"{label} of pid {pid}"


def kind_words(site: FeedSite) -> str:
    """'queue', 'multiprocessing queue'."""
    return f"multiprocessing {site.kind}" if site.across == "processes" else site.kind


def thing(step: FeedStep) -> str:
    """'queue results (train.py:40)': what it waits on, and the line that waits."""
    return f"{kind_words(step.site)} {step.site.name} ({frames.short_file(step.at.file)}:{step.at.line})"


def fed_by(site: FeedSite) -> str:
    """'fed by' a queue's feeder, 'set by' an event's, 'notified by' a condition's."""
    return {"queue": "fed by", "event": "set by", "condition": "notified by"}[site.kind]


def waits_on(step: FeedStep) -> str:
    return f"waits on {thing(step)}"


def feeders_words(chain: FeedChain) -> str:
    """How the chain ends, for a title: who would feed the last object, and what became of them."""
    site = chain.last.site
    verb = _VERBS[site.kind]
    if chain.end == "unfed":
        files = " or ".join(frames.short_file(f) for f in dict.fromkeys((site.file, site.made_in)) if f)
        return f"nothing in {files} {verb} it"
    starts = [s for d in site.feeders or () for s in d.starts]
    if chain.end == "ended" and by_tasks(chain):
        functions = ", ".join(sorted({d.function for d in site.feeders or ()}))
        if len(starts) == 1:
            return f"the only task that {verb} it ({functions}, submitted at line {starts[0].line}) ended"
        return f"the tasks that {verb} it (running {functions}) ended"
    if chain.end == "ended":
        named = sorted({f'"{s.name}"' for s in starts if s.name})
        if len(starts) == 1:
            who = named[0] if named else f"(running {site.feeders[0].function})" if site.feeders else ""
            return f"the only thread that {verb} it, {who}, ended"
        functions = ", ".join(sorted({d.function for d in site.feeders or ()}))
        return f"the threads that {verb} it (running {functions}) ended"
    if chain.end == "died":
        if not chain.dead:
            functions = ", ".join(sorted({d.function for d in site.feeders or ()}))
            return f"no live process runs the code that {verb} it ({functions})"
        first = chain.dead[0]
        more = f" (and {len(chain.dead) - 1} more)" if len(chain.dead) > 1 else ""
        return f"the process that {verb} it, pid {first.pid}{more}, {death_words(first)}"
    return ""


def by_tasks(chain: FeedChain) -> bool:
    """The last object's feeders run only as an executor's tasks (`pool.submit(load)`)."""
    starts = [s for d in chain.last.site.feeders or () for s in d.starts]
    return bool(starts) and all(s.kind == "task" for s in starts)


def death_words(death: ProcessDeath) -> str:
    if death.signal:
        return f"died (killed by {death.signal})"
    if death.exit_code not in (None, 0):
        return f"died (exit code {death.exit_code})"
    return "ended"


def feeder_source(site: FeedSite) -> str:
    """'load (line 12), started at line 30': where the feeding code is."""
    parts = []
    for d in site.feeders or ():
        started = ", ".join(
            f"{'submitted' if s.kind == 'task' else 'started'} at line {s.line}" for s in d.starts
        )
        at = f"{frames.short_file(d.file)}:{d.line}" if d.file else f"line {d.line}"
        parts.append(f"{d.function} ({at})" + (f", {started}" if started else ""))
    return "; ".join(parts)


def ended_in_output(chain: FeedChain, log_tail: Sequence[str]) -> str:
    """How the ended feeder thread's exception reads in the output ("Exception in thread loader: ...
    FileNotFoundError: ..."), when the output shows it."""
    names = {s.name for d in chain.last.site.feeders or () for s in d.starts if s.name}
    for n, line in enumerate(log_tail):
        if line.startswith("Exception in thread ") and any(f" {name}" in line for name in names):
            rest = log_tail[n + 1 :]
            error = next((t for t in rest if t and not t[0].isspace() and not t.startswith("Traceback")), "")
            return f"{line} ... {error}" if error else line
    return ""

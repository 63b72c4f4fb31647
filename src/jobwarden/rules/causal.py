"""The root cause across the whole tree: which failure came first, and what only followed from it.

A run's *incidents* are the failures of its processes, one per process: an abnormal end (a signal, a
non-zero exit), an uncaught exception, or an exception that another process relayed (a worker's traceback
inside its parent's re-raise: rules.relay), attributed to the process that raised it. In time order the
first *cause* is the root cause. Every incident is weighed by its evidence, whatever its class:

- CAUSE: a kill (SIGKILL, a crash signal, an OOM kill, any signal to the main process) or an exception
  that neither reports nor reacts;
- WEAK: a bare non-zero exit, with no traceback: a cause like any other, but one without evidence of its
  own, so a failure with its own evidence that is no report or reaction leads over it (a helper command's
  exit code that its parent took as an answer, carrying on for CARRIED_ON_S, is a TEARDOWN);
- TEARDOWN: SIGTERM, SIGINT, SIGHUP or SIGQUIT to a child: a launcher's cleanup;
- REPORT: an exception that relays another process's traceback, names a wrapper known to report a child's
  death (torchrun's ChildFailedError, BrokenProcessPool, loky's TerminatedWorkerError, the DataLoader's
  "worker ... exited unexpectedly": extra evidence, never needed), speaks of a process, worker, rank, pid
  or exit code after another process failed, or is a peer's communication error then (closed or reset by
  peer, broken pipe, EOF); a death by SIGPIPE then too. A report never leads while anything else failed.

A WEAK that nothing followed until jobwarden or the engine began to end the run, its parent failing in
nothing, is ANSWERED: the stop ended the run, and it is never the root.

The root is the first CAUSE, else the first WEAK, else the first TEARDOWN, else the first REPORT; a WEAK
that surely came before the first CAUSE (two deaths on the kernel's clock) leads it: that cause came
after. Unless the WEAK changed nothing: the job went on, nothing failed until the CAUSE, an exception of
its own, and everything then reacted to that (a launcher's helper that exited 255 seconds before a rank
raised). Weights come from what each failure says, not from the clock, so clock skew between the hooks'
moments and the kernel's can reorder causes among themselves but never lift a report above its cause;
"after another failed" is judged with TOLERANCE_S of slack. Moments come from the hooks (an exception's,
a relayed one's when its worker formatted it), the kernel's process events or the reaping parent, else
from when the shim noticed, within milliseconds: every member's pidfd wakes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from jobwarden.observations import ProcessDeath, UncaughtException
from jobwarden.rules import mltext, relay
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.memory import oom_killed

CAUSE, WEAK, TEARDOWN, REPORT = 3, 2, 1, 0
ANSWERED = -1  # a child's bare exit its parent took as an answer before a stop: never the root cause
TOLERANCE_S = 1.0  # "after": hooks and kernel stamp moments with clocks that may disagree by this much
SAME_CLOCK_S = 0.1  # two deaths' moments: the kernel's, or the shim's within a few ms of it
CARRIED_ON_S = 10.0  # a child's bare exit its parent outlived this long, with nothing failing meanwhile
UNKNOWN_PID = -1  # a relayed exception whose process nothing names (no hooks to record it)

CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"})
TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})
# Wrappers known to report the death of a child, and what the children are called then: extra evidence
# (the text of each would make it a report anyway) and the name of the failed process in the verdict.
WRAPPERS = {
    "ChildFailedError": "rank",  # torch.distributed.elastic (torchrun)
    "BrokenProcessPool": "ProcessPoolExecutor worker",
    "BrokenExecutor": "executor worker",
    "TerminatedWorkerError": "loky worker",  # joblib / loky
}
_DATALOADER_REPORT = "DataLoader worker (pid"
_ABORTED_AFTER_S = 5.0  # an exception's process that aborts this soon after it died of the exception
_LAST_WORDS_S = 2.0  # a traceback a process printed this shortly before it exited is why it exited


class Incident(NamedTuple):
    """One process's failure. `pid` is UNKNOWN_PID for a relayed exception nothing attributes."""

    pid: int
    at: float
    weight: int  # CAUSE, WEAK, TEARDOWN, REPORT; ANSWERED (never a root)
    death: ProcessDeath | None = None
    exception: UncaughtException | None = None  # its own, from its `[rankN]:` lines, or relayed
    why: str | None = None  # a REPORT's evidence: "re-raised pid 811's ValueError", "a peer's error (EOF)"
    relayed_by: int | None = None  # the process that re-raised this one's exception
    rank: int | None = None
    is_main: bool = False
    wrapper: str | None = None  # a REPORT's own exception type: "ChildFailedError", "ProcessRaisedException"
    depth: int = 0  # how many of its ancestors the evidence knows: the main process is 0

    @property
    def order(self) -> tuple[float, int, int, int, int]:
        """Earlier first; at the same moment (one tick noticed both) the stronger evidence, a process before
        its ancestors (a parent ends after its child), a death by signal before an exit; then by pid, so
        that the order never depends on the order the evidence arrived in."""
        signalled = 0 if self.death is not None and self.death.signal else 1
        return (self.at, -self.weight, -self.depth, signalled, self.pid)

    @property
    def signal(self) -> str | None:
        return self.death.signal if self.death is not None else None


def incidents(ev: RunEvidence) -> list[Incident]:
    """The run's failures up to the main process's end (or jobwarden's stop), in time order."""
    tree = _Tree(ev)
    found = [tree.incident(pid) for pid in tree.failed()]
    found = _demote_answered(found, tree)
    return sorted(found, key=lambda i: i.order)


def root_incident(ev: RunEvidence, found: Sequence[Incident] | None = None) -> Incident | None:
    """The first cause; else the first weakly evidenced one, the first teardown, the first report. None
    when the run has no incident (still running, hung, succeeded)."""
    found = incidents(ev) if found is None else found
    firsts = [
        next((i for i in found if i.weight == weight), None) for weight in (CAUSE, WEAK, TEARDOWN, REPORT)
    ]
    cause, weak = firsts[0], firsts[1]
    # a kill that came after a process had already failed did not cause that failure; but a helper's exit
    # that changed nothing does not outrank the failure everything then reacted to
    if cause and weak and _surely_before(weak, cause) and not _changed_nothing(weak, cause, found):
        return weak
    return next((i for i in firsts if i is not None), None)


def _changed_nothing(weak: Incident, cause: Incident, found: Sequence[Incident]) -> bool:
    """`weak` (a bare exit) came first, yet the job went on as if it had not: nothing failed between it
    and `cause`, a failure with evidence of its own (an exception: a kill may be a framework's reaction
    to the exit, as Ray's shutdown is), and the job then reacted to `cause` (a teardown, a report).
    `accelerate launch`: a helper of the launch exits 255, two seconds later a rank raises, the launcher
    tears the other ranks down and reports the rank."""
    if weak.is_main or cause.exception is None:
        return False
    between = any(weak.at < i.at < cause.at for i in found if i is not weak and i is not cause)
    reacted = any(i.at >= cause.at and i.weight in (TEARDOWN, REPORT) for i in found)
    return not between and reacted


def _surely_before(a: Incident, b: Incident) -> bool:
    """`a` happened before `b` whatever the clocks: two deaths are stamped by the kernel's events or the
    shim within milliseconds of each other (SAME_CLOCK_S); a hook's moment may disagree by TOLERANCE_S.
    (Ray's shutdown SIGKILLs an idle worker a second after another exited 3: that kill caused nothing.)"""
    same_clock = a.exception is None and b.exception is None
    return a.at < b.at - (SAME_CLOCK_S if same_clock else TOLERANCE_S)


def _demote_answered(found: list[Incident], tree: _Tree) -> list[Incident]:
    """A child's bare exit that nothing followed for CARRIED_ON_S while its parent lived on was an answer
    the parent took (`grep` finding nothing, `readlink` in a shell script), not the run's failure. So are
    such exits, one or several, that nothing else followed until jobwarden or the engine began to end the
    run, or until the OOM killer took a process, their parents failing in nothing: the stop or the memory
    ended the run (pyenv's `python3` runs readlink and more, which exit 1, in its first moments; a helper's
    exit code makes no memory run out)."""
    moments = sorted(i.at for i in found)
    end = tree.cutoff if tree.cutoff != float("inf") else max(moments, default=0.0)
    helpers = {i.pid for i in found if i.weight == WEAK and not i.is_main and _parent_went_on(i.pid, tree)}
    others = [i.at for i in found if i.pid not in helpers]  # failures that no helper's answer explains
    demoted = []
    for i in found:
        if i.weight == WEAK and not i.is_main:
            if _quiet(i, moments, i.at + CARRIED_ON_S) and end > i.at + CARRIED_ON_S:
                i = i._replace(weight=TEARDOWN, why="its parent carried on")
            elif i.pid in helpers and _nothing_else_until(tree.ev.stopping_at, i, others):
                i = i._replace(weight=ANSWERED, why="its parent carried on until the run was stopped")
            elif i.pid in helpers and _nothing_else_until(tree.first_oom_kill, i, others):
                i = i._replace(weight=ANSWERED, why="its parent carried on until the OOM killer struck")
        demoted.append(i)
    return demoted


def _quiet(i: Incident, moments: Sequence[float], until: float) -> bool:
    """Nothing else failed after `i` up to `until`."""
    return not any(i.at < m <= until for m in moments)


def _parent_went_on(pid: int, tree: _Tree) -> bool:
    """The parent is known and failed in nothing, the OOM killer aside."""
    parent = tree.parents.get(pid)
    return parent is not None and (parent not in tree.ended or parent in tree.oom) and parent not in tree.own


def _nothing_else_until(end: float | None, i: Incident, others: Sequence[float]) -> bool:
    """`i` came before `end` and no other failure (`others`) came between them."""
    return end is not None and i.at <= end and not any(i.at < m < end for m in others)


class _Tree:
    """What the evidence says about each process: its death, its exception, its rank, its parent."""

    def __init__(self, ev: RunEvidence) -> None:
        self.ev = ev
        self.cutoff = _cutoff(ev)
        self.oom = set(oom_killed(ev))
        oom_deaths = [d.at for d in ev.deaths if d.pid in self.oom]
        self.first_oom_kill = min(oom_deaths) if oom_deaths else None
        self.main = ev.pid
        deaths = [*ev.deaths, *_reported_deaths(ev)]
        # how each process ended, whenever; those that ended badly up to the cutoff are incidents (a
        # process that raised before it, and took its time to die, still ended as it did)
        self.ended = {d.pid: d for d in deaths if d.abnormal}
        self.deaths = {pid: d for pid, d in self.ended.items() if d.at <= self.cutoff}
        self.parents = {p.pid: p.ppid for p in ev.processes}
        self.parents.update({d.pid: d.ppid for d in deaths if d.ppid is not None})
        self.ranks = {d.pid: d.rank for d in deaths if d.rank is not None}
        self.ranks.update({p.pid: p.rank for p in ev.processes if p.rank is not None})
        self.own = _own_exceptions(ev, self)
        relays = _relays(ev, self)
        self.relayed, self.relayed_by, self.reporters = relays.exceptions, relays.relayed_by, relays.reporters
        self._ranks_from_reports()

    def failed(self) -> list[int]:
        pids = [*self.deaths, *(p for p, e in self.own.items() if e.at <= self.cutoff), *self.relayed]
        return list(dict.fromkeys(pids))

    # --- one process's incident ---------------------------------------------------------------------

    def incident(self, pid: int) -> Incident:
        death = self.ended.get(pid)
        exc = self.relayed.get(pid) or self.own.get(pid)
        base = Incident(
            pid,
            exc.at if exc is not None else death.at if death is not None else self.cutoff,
            CAUSE,
            death,
            exc,
            rank=self._rank(pid, exc),
            is_main=pid == self.main,
            depth=self.depth(pid),
        )
        if exc is None:
            return self._weigh_death(base)
        weighed = self._weigh_exception(base, exc)  # a relayed exception weighs what it says, as any
        return weighed._replace(relayed_by=self.relayed_by.get(pid)) if pid in self.relayed else weighed

    def _weigh_exception(self, i: Incident, exc: UncaughtException) -> Incident:
        kind = relay.short_type(exc.type)
        relayed = self.reporters.get(i.pid)
        if relayed:
            return i._replace(weight=REPORT, why=f"re-raised {relayed}", wrapper=kind)
        if kind == "KeyboardInterrupt" or mltext.signal_exception([f"{exc.type}: {exc.message}"]):
            # a signal turned into an exception (SIGINT, torchrun's SignalException): a kill of the main
            # process, a teardown of any other
            return i if i.is_main else i._replace(weight=TEARDOWN)
        wrapper = next((relay.short_type(t) for t in exc.types if relay.short_type(t) in WRAPPERS), None)
        if wrapper is not None or _DATALOADER_REPORT in exc.message:
            return i._replace(
                weight=REPORT, why=f"raised {wrapper or kind} reporting it", wrapper=wrapper or kind
            )
        if not self.failed_before(i.pid, exc.at):
            return i
        peer = relay.peer_error(exc)
        if peer is not None:
            said = f" ({peer})" if peer != kind else ""
            return i._replace(
                weight=REPORT, why=f"failed in turn: {kind}, a peer's communication error{said}"
            )
        if relay.reports_on(exc) is not None:
            return i._replace(weight=REPORT, why=f"raised {kind} reporting it", wrapper=kind)
        return i

    def _weigh_death(self, i: Incident) -> Incident:
        d = i.death
        assert d is not None
        if d.pid in self.oom or d.signal in CRASH_SIGNALS or d.signal == "SIGKILL":
            return i
        if d.signal == "SIGPIPE" and self.failed_before(d.pid, d.at):
            return i._replace(weight=REPORT, why="wrote into a pipe whose reader had failed (SIGPIPE)")
        if d.signal is not None:
            return i if d.is_main else i._replace(weight=TEARDOWN)
        return i._replace(weight=WEAK)

    def failed_before(self, pid: int, at: float) -> bool:
        """Another process failed before `at`, with TOLERANCE_S of slack. A teardown (SIGTERM...) counts
        only when strictly before: it is what a launcher does after a failure, a report's cause is not."""
        for d in self.deaths.values():
            if d.pid == pid or d.at > at + TOLERANCE_S:
                continue
            if d.signal in TEARDOWN_SIGNALS and d.at >= at:
                continue
            return True
        others = (e for p, e in (*self.own.items(), *self.relayed.items()) if p != pid)
        return any(e.at <= at + TOLERANCE_S for e in others)

    def depth(self, pid: int) -> int:
        """How many generations below the main process `pid` is, as far as the evidence knows (a process
        whose parents are unknown counts one more than those it knows)."""
        if pid == self.main:
            return 0
        seen: set[int] = set()
        while pid != self.main and pid in self.parents and pid not in seen:
            seen.add(pid)
            pid = self.parents[pid]
        return len(seen) if pid == self.main else len(seen) + 1

    # --- ranks --------------------------------------------------------------------------------------

    def _rank(self, pid: int, exc: UncaughtException | None) -> int | None:
        if pid in self.ranks:
            return self.ranks[pid]
        return exc.rank if exc is not None else None

    def _ranks_from_reports(self) -> None:
        """ "process 1 terminated with exit code 3": the one failed process with that exit code is process
        1 (torch.multiprocessing.spawn's index, the rank DDP code gives it). torchrun's ChildFailedError
        report names each failed rank with its pid: a rank the shim saw end without learning its rank
        (held from its fork, ended before its exec was looked at) is named by it."""
        report = mltext.child_failed(self.ev.log_tail)
        for f in (report.root_cause, *report.other_failures) if report is not None else ():
            if f.pid in self.deaths and f.pid not in self.ranks:
                self.ranks[f.pid] = f.rank
        texts = [t for e in self.own.values() for t in (e.message, *(m for _, m in e.chain))]
        for index, code in relay.named_ends(texts):
            matching = [d for d in self.deaths.values() if d.exit_code == code and not d.is_main]
            if len(matching) == 1 and matching[0].pid not in self.ranks:
                self.ranks[matching[0].pid] = index


# --- each process's exception -----------------------------------------------------------------------


def _own_exceptions(ev: RunEvidence, tree: _Tree) -> dict[int, UncaughtException]:
    """The exception each failed process died of: the hooks' record; else, for a rank, its `[rankN]:`
    traceback (torch's excepthook replaces the hooks' at init_process_group); else what it printed as it
    exited (multiprocessing's Process prints its child's traceback and exits 1, with no excepthook); else,
    for the main process, the last top-level traceback in the output that no other process claims."""
    own = {e.pid: e for e in ev.exceptions}
    by_rank = mltext.rank_tracebacks(ev.log_tail)
    for d in tree.deaths.values():
        if d.pid in own:
            continue
        if _torn_down(d):
            last = _last_words(ev.caught, d)
            if last is not None:
                own[d.pid] = last
            continue
        if d.exit_code in (None, 0) and d.signal != "SIGABRT":
            continue
        rank = tree.ranks.get(d.pid)
        tb = by_rank.get(rank) if rank is not None else None
        if tb is not None:
            own[d.pid] = UncaughtException(d.pid, d.at, tb.exc_type, tb.message, tb.frames, rank=rank)
            continue
        last = _last_words(ev.caught, d)
        if last is not None:
            own[d.pid] = last
    _main_exception(ev, tree, own, by_rank)
    return own


def _torn_down(d: ProcessDeath) -> bool:
    """Ended by a launcher's teardown signal. One that had formatted an exception in its last moments was
    already on its way out of it: torch.multiprocessing.spawn's process formats its exception, exits 1
    and tears down its gloo group first; its peer fails on the closed connection and exits first, and the
    parent then SIGTERMs the process still finalizing (seen in CI under load)."""
    return d.signal in TEARDOWN_SIGNALS and not d.is_main


def _last_words(caught: Sequence[UncaughtException], d: ProcessDeath) -> UncaughtException | None:
    said = [c for c in caught if c.pid == d.pid and d.at - _LAST_WORDS_S <= c.at <= d.at + TOLERANCE_S]
    return said[-1] if said else None


def _main_exception(
    ev: RunEvidence, tree: _Tree, own: dict[int, UncaughtException], by_rank: dict[int, mltext.PyTraceback]
) -> None:
    """The main process's exception, from its output: a traceback no other process claims."""
    main = tree.ended.get(ev.pid) if ev.pid is not None else None
    if main is None or main.pid in own or main.signal is not None:
        return
    unclaimed = [(r, tb) for r, tb in by_rank.items() if r not in tree.ranks.values()]
    if len(unclaimed) == 1 and main.rank is None:  # Lightning's rank 0 is the main process itself
        rank, tb = unclaimed[0]
        tree.ranks[main.pid] = rank
        own[main.pid] = UncaughtException(main.pid, main.at, tb.exc_type, tb.message, tb.frames, rank=rank)
        return
    printed = relay.top_level_traceback(ev.log_tail)
    if printed is not None and not any(relay.same_exception(e, printed) for e in own.values()):
        own[main.pid] = UncaughtException(
            main.pid, main.at, printed.exc_type, printed.message, printed.frames
        )


class _Relays(NamedTuple):
    exceptions: dict[int, UncaughtException]  # relayed by others, by the pid that raised them
    relayed_by: dict[int, int]  # that pid -> the process that re-raised it
    reporters: dict[int, str]  # a relaying process -> what it re-raised ("pid 811's ValueError")


def _relays(ev: RunEvidence, tree: _Tree) -> _Relays:
    found = _Relays({}, {}, {})
    sources = [(pid, list(_messages(exc)), exc.at) for pid, exc in tree.own.items()]
    main = tree.ended.get(ev.pid) if ev.pid is not None else None
    if main is not None and not any(e.pid == main.pid for e in ev.exceptions):
        sources.append((main.pid, [], main.at))  # printed only: its relays are read from the output
    for reporter, messages, at in sources:
        for r in relay.relayed_in(messages) if messages else relay.relayed_in_lines(ev.log_tail):
            remote = relay.attribute(r, reporter, at - 1e-3, ev.caught)
            if remote.pid == reporter:
                continue
            found.exceptions.setdefault(remote.pid, remote)
            found.relayed_by.setdefault(remote.pid, reporter)
            who = f"pid {remote.pid}" if remote.pid != UNKNOWN_PID else "a worker"
            found.reporters.setdefault(reporter, f"{who}'s {relay.short_type(remote.type)}")
    return found


def _messages(exc: UncaughtException) -> Iterable[str]:
    yield exc.message
    for _, message in exc.chain:
        yield message


# --- what only the launcher's report says -------------------------------------------------------------


def _reported_deaths(ev: RunEvidence) -> list[ProcessDeath]:
    """Ranks that torchrun's ChildFailedError report names and the shim never saw end (no kernel events,
    no hooks): the report's pid, rank and exit code, at the main process's end."""
    report = mltext.child_failed(ev.log_tail)
    main = next((d for d in ev.deaths if d.is_main), None)
    if report is None or main is None:
        return []
    seen = {d.pid for d in ev.deaths}
    return [
        ProcessDeath(
            f.pid,
            main.pid,
            f"rank {f.rank} of {report.name or 'the job'} (from torchrun's report)",
            main.at,
            None if f.signal else f.exitcode,
            f.signal,
            rank=f.rank,
        )
        for f in (report.root_cause, *report.other_failures)
        if f.pid not in seen
    ]


def _cutoff(ev: RunEvidence) -> float:
    """Where the run's story ends: the main process's end, jobwarden's stop, or the main process's uncaught
    exception (TOLERANCE_S later): what dies after it is its own shutdown (atexit handlers, a framework
    killing its daemons: Ray's shutdown SIGKILLs its workers seconds after the driver raised)."""
    ends = [d.at for d in ev.deaths if d.is_main]
    if ev.stopping_at is not None:
        ends.append(ev.stopping_at)
    ends += [e.at + TOLERANCE_S for e in ev.exceptions if e.pid == ev.pid]
    return min(ends, default=float("inf"))

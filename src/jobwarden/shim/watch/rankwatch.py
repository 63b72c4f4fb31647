"""Where each rank of a distributed job is, watched by the speed watch (DESIGN.md "Ranks"): every tick, the
main thread of each rank process (at most MAX_RANKS of them) is looked at, cheapest first: its state from
the tree's own stat line (free: already read), and, when it is not running, the system call it is blocked
in (/proc/PID/task/PID/syscall, one small read; rules.speed.ranks.where_of says what it means). Every
READ_EVERY_S the rank's own cpu cgroup is read (its quota, its throttling: a rank moved into a cgroup of
its own is held back alone), and its cgroup looked up again every CGROUP_EVERY_S.

A blocked main thread's call says little by itself (a futex may be a collective or a DataLoader queue):
now and then (the stack sampler's interval, STACK_EVERY_S) one rank that is not computing is dumped
(py-spy --nonblocking, on a thread: the shim never waits on it, the rank never pauses), ranks in turn. What
the dump shows (rules.speed.ranks.stack_where: a collective, the DataLoader) is learned for that call: its
next looks in the same call are said to be there, with the frame; a sleep is told with the job's own frame
it sleeps in (ranks_job.py:52).

The looks of the last WINDOW_S are kept per rank: their shares are where its time went (the straggler's
evidence), and the last one is where it is now (`status`'s `ranks`). A rank whose own progress shows its
steps is looked at from its first step: the looks before saw its start-up. A rank is the topmost process
that carries it (its DataLoader workers and other children inherit RANK from it and are no rank of their
own).

Every POLL_EVERY_S each rank that serves its flight recorder (the hooks' thread, probes.flightrec) is asked
when it called its last collectives; the answers of the window say which rank the others wait for, whatever
its main thread looks like (rules.speed.arrivals). A poll costs each rank a dump of its recorder, 1.8 ms
of CPU (docs/measurements.md).

Measured cost (scripts/bench-ranks): see docs/measurements.md."""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from jobwarden.errors import ProcessGone
from jobwarden.model import ProcessId
from jobwarden.observations import Arrival
from jobwarden.osapi.cpuquota import CpuCgroup, CpuStat, cpu_cgroup_of
from jobwarden.osapi.procfs import RUNNING, ProcFS
from jobwarden.osapi.syscalls import NAMES as SYSCALL_NAMES
from jobwarden.probes import flightrec
from jobwarden.probes.pyspy import find_py_spy
from jobwarden.rules.speed.arrivals import waits
from jobwarden.rules.speed.evidence import GpuClock, RankView, RecorderWaits, StackSample
from jobwarden.rules.speed.gpu import LIMITS
from jobwarden.rules.speed.loading import LOADER_WORKER_COMM
from jobwarden.rules.speed.ranks import WHERE, stack_where, where_of
from jobwarden.rules.speed.stalls import own_frame
from jobwarden.shim.watch.stacksample import StackDump, stack_every_s

if TYPE_CHECKING:
    from jobwarden.observations import GpuProcess
    from jobwarden.shim.tree.jobtree import Member

MAX_RANKS = 16  # rank processes looked at each tick, lowest ranks first
WINDOW_S = 20.0  # as the speed watch's window
CGROUP_EVERY_S = 10.0  # a rank's cpu cgroup looked up again (a rank may be moved into one of its own)
POLL_EVERY_S = 10.0  # each rank's flight recorder asked for its arrivals: 1.8 ms of its CPU a poll
ANSWER_WITHIN_S = 2.0  # a rank's answer looked for this long after each poll
ARRIVALS_KEPT = 512  # a rank's arrivals kept at most, the newest: two answers, the window's


class RankHints(NamedTuple):
    """What the progress sources say of the ranks (shim.watch.progresswatch.rank_hints)."""

    steps: Mapping[int, int] = {}  # pid: its own bar's step (the hooks' records)
    ranks: Mapping[int, int] = {}  # pid: the rank the hooks' records name
    rank_steps: Mapping[int, int] = {}  # rank: its step in the output (`[rankN]:` lines)
    beat_steps: Mapping[int, int] = {}  # rank: its step in its own heartbeat (jobwarden.heartbeat)


class _Rank:
    """What is kept of one rank process."""

    def __init__(self, member: Member, rank: int) -> None:
        ranks = member.ranks
        self.rank = rank
        self.local_rank, self.node = (ranks.local_rank, ranks.group_rank) if ranks else (None, None)
        self.pid = member.pid
        self.looks: deque[tuple[float, str, str]] = deque()  # (mono, where, detail)
        self.steps: deque[tuple[float, int]] = deque()  # (mono, step) where its own bar moved
        self.stepped = False  # its own progress showed a step: its looks count from the first
        self.cgroup: CpuCgroup | None = None
        self.cgroup_at = -CGROUP_EVERY_S
        self.cpu: deque[tuple[float, CpuStat]] = deque()
        self.syscall: str | None = None  # at the last look
        self.learned: dict[str | None, tuple[str, str]] = {}  # call: (where, frame), from its stack samples
        self.sleeps_in = ""  # the job's own frame its main thread slept in, as a sample showed
        self.arrivals: dict[tuple[str, int], Arrival] = {}  # (group, seq): when it called that collective
        self.last_call: Arrival | None = None  # the newest of them all, kept when the window empties
        self.asked_at: float | None = None  # when its recorder was last polled, until its answer came
        self.answer_version: tuple[int, int, int] | None = None  # of its answer last read (flightrec.version)

    def call_rate(self) -> float | None:
        """Its collectives a second over the window, in its newest call's group (torch numbers each
        group's calls: the numbers say how many were made, those the answers left out too)."""
        if self.last_call is None:
            return None
        mine = [a for a in self.arrivals.values() if a.group == self.last_call.group]
        if len(mine) < 2:
            return None
        first, last = min(mine, key=_called_at), max(mine, key=_called_at)
        span = last.created_ns - first.created_ns
        return (last.seq - first.seq) / span * 1e9 if span > 0 else None

    def trim(self, mono: float) -> None:
        for kept in (self.looks, self.steps, self.cpu):
            while len(kept) > 1 and kept[0][0] < mono - WINDOW_S:
                kept.popleft()

    def note_arrivals(self, found: Sequence[Arrival], now_ns: int) -> None:
        """A poll's answer: its arrivals added to those kept, the window's kept (`now_ns`: the wall clock,
        which the recorder on this node reads too)."""
        # a call time ahead of the clock (a clock stepped back, a hostile job) would never leave the window
        found = [a for a in found if a.created_ns <= now_ns + int(WINDOW_S * 1e9)]
        self.arrivals.update(((a.group, a.seq), a) for a in found)
        newest = max(found, key=_called_at, default=None)
        if newest is not None and (self.last_call is None or newest.created_ns >= self.last_call.created_ns):
            self.last_call = newest
        since = now_ns - int(WINDOW_S * 1e9)
        kept = sorted((a for a in self.arrivals.values() if a.created_ns >= since), key=_called_at)
        self.arrivals = {(a.group, a.seq): a for a in kept[-ARRIVALS_KEPT:]}


class RankWatch:
    def __init__(
        self, procfs: ProcFS, machine: str | None = None, dumps: bool = True, py_dir: Path | None = None
    ) -> None:
        """`dumps`: take stack samples of the ranks (py-spy), where py-spy is there; `py_dir`: where the
        ranks' hooks serve their flight recorders (None: no polls)."""
        self.procfs = procfs
        self.py_dir = py_dir
        self._next_poll = 0.0
        self._waits: dict[int, RecorderWaits] = {}  # rank: its waits, as the answers last read say
        self._waits_at = 0.0
        self.now_ns = time.time_ns  # the wall clock the recorders' call times are read against
        self.syscalls = SYSCALL_NAMES.get(machine or os.uname().machine, {})
        self._ranks: dict[ProcessId, _Rank] = {}
        self.stack_every_s = stack_every_s()
        self._next_dump = 0.0
        self._dump: tuple[StackDump, ProcessId, str | None] | None = None  # (dump, rank, its call then)
        self._py_spy: Path | bool | None = False if dumps else None  # False: not looked for yet
        self._turn = 0
        self._gpus: dict[int, GpuClock] = {}  # pid: the GPU that rank computes on (note_gpus)

    def tick(self, mono: float, members: Iterable[Member], hints: RankHints | None = None) -> None:
        """One look at every rank's main thread; their own step counters where the progress sources
        show them (`hints`)."""
        members = list(members)
        hints = hints or RankHints()
        ranked = _ranked(members, hints.ranks)
        present = {m.ident for m, _ in ranked}
        if present != set(self._ranks):
            self._waits = {}  # of other processes (a restart's ranks may have the same numbers)
        for ident in [i for i in self._ranks if i not in present]:
            del self._ranks[ident]
        if not ranked:
            return
        loaders = {m.ppid for m in members if m.comm == LOADER_WORKER_COMM}
        for m, rank in ranked:
            kept = self._ranks.get(m.ident)
            if kept is None:
                kept = self._ranks[m.ident] = _Rank(m, rank)
            state = m.snapshot.state if m.snapshot else "?"
            syscall = None
            if state not in ("R", "Z", "X"):
                with contextlib.suppress(ProcessGone):
                    number = self.procfs.main_thread_syscall(m.pid)
                    syscall = _call_name(number, self.syscalls)
            kept.syscall = syscall
            kept.looks.append((mono, *self._where_now(kept, state, syscall, m.pid in loaders)))
            step = hints.steps.get(m.pid, hints.beat_steps.get(rank, hints.rank_steps.get(rank)))
            if step is not None and (not kept.steps or kept.steps[-1][1] != step):
                if kept.steps and step < kept.steps[-1][1]:
                    kept.steps.clear()  # a new bar
                if not kept.stepped:
                    # the looks before its first step saw its start-up (torch's import, the rendezvous),
                    # which ranks pass at their own pace: one still importing while the others wait is
                    # no straggler, and over a short window both halves may see it
                    kept.stepped = True
                    while len(kept.looks) > 1:
                        kept.looks.popleft()
                kept.steps.append((mono, step))
            kept.trim(mono)
        self._sample_stacks(mono)
        self._poll_recorders(mono)

    def _where_now(self, kept: _Rank, state: str, syscall: str | None, has_loader: bool) -> tuple[str, str]:
        where, detail = where_of(state, syscall, has_loader)
        if where in ("collective", "unknown") and syscall in kept.learned:
            where, frame = kept.learned[syscall]
            detail = f"{frame}, {syscall} wait"
        elif where == "idle" and kept.sleeps_in:
            detail = f"{syscall} in {kept.sleeps_in}"
        return where, detail

    # --- the ranks' flight recorders ----------------------------------------------------------------

    def _poll_recorders(self, mono: float) -> None:
        """Read the answers that came since the last poll (one stat a rank a tick, while one is awaited);
        poll again when due. A rank that serves no recorder (no FIFO, or no reader on it) is not asked
        again until the next poll."""
        if self.py_dir is None or len(self._ranks) < 2:
            self._waits = {}
            return
        answered = False
        for kept in self._ranks.values():
            if kept.asked_at is None:
                continue
            path = self.py_dir / f"{kept.pid}{flightrec.ARRIVALS}"
            answer_version = flightrec.version(path)
            if answer_version is not None and answer_version != kept.answer_version:
                kept.answer_version, kept.asked_at = answer_version, None
                found = flightrec.read_arrivals(path, kept.pid)
                if found is not None:
                    kept.note_arrivals(found, self.now_ns())
                    answered = True
            elif mono - kept.asked_at >= ANSWER_WITHIN_S:
                kept.asked_at = None
        if answered and all(k.asked_at is None for k in self._ranks.values()):  # once a round
            ranks = self._ranks.values()
            found_waits = waits({k.rank: tuple(k.arrivals.values()) for k in ranks if k.arrivals})
            # a rank that answered nothing may be the one the others wait for: all or none
            self._waits = found_waits if len(found_waits) == len(self._ranks) else {}
            self._waits_at = mono
        if mono < self._next_poll:
            return
        self._next_poll = mono + POLL_EVERY_S
        if mono - self._waits_at > WINDOW_S:
            self._waits = {}  # no round answered by every rank of late
        for kept in self._ranks.values():
            if flightrec.poll(self.py_dir, kept.pid):
                kept.asked_at = mono

    # --- stack samples of the ranks -------------------------------------------------------------------

    def _sample_stacks(self, mono: float) -> None:
        """Collect a finished dump; start the next one when due: a rank that is not computing, in turn."""
        if self._dump is not None and not self._dump[0].is_alive():
            done, ident, syscall = self._dump
            self._dump = None
            if done.sample is not None and ident in self._ranks:
                self.learn(ident, syscall, done.sample)
        if self._dump is not None or mono < self._next_dump or len(self._ranks) < 2:
            return
        self._next_dump = mono + self.stack_every_s
        binary = self._binary()
        blocked = [
            (i, k)
            for i, k in sorted(self._ranks.items(), key=lambda ik: ik[1].rank)
            if k.looks and k.looks[-1][1] != "computing"
        ]
        if binary is None or not blocked:
            return
        self._turn = (self._turn + 1) % len(blocked)
        ident, kept = blocked[self._turn]
        self._dump = (StackDump(binary, kept.pid, mono), ident, kept.syscall)

    def learn(self, ident: ProcessId, syscall: str | None, sample: StackSample) -> None:
        """What a stack sample of a rank's blocked main thread shows, kept for its next looks."""
        kept = self._ranks[ident]
        found = stack_where(sample)
        if found is not None:
            kept.learned[syscall] = found
            return
        kept.learned.pop(syscall, None)  # that call is something else now
        own = own_frame(sample)
        if own is not None and syscall is not None and where_of("S", syscall, False)[0] == "idle":
            function, file, line = own
            kept.sleeps_in = f"{function} ({Path(file).name}{f':{line}' if line else ''})"

    def _binary(self) -> Path | None:
        if self._py_spy is False:
            self._py_spy = find_py_spy()
        return self._py_spy if isinstance(self._py_spy, Path) else None

    def read(self, mono: float) -> None:
        """Each rank's own cpu cgroup: looked up now and then, its cpu.stat read each time."""
        for kept in self._ranks.values():
            if mono - kept.cgroup_at >= CGROUP_EVERY_S:
                kept.cgroup_at = mono
                found = cpu_cgroup_of(kept.pid, str(self.procfs.root))
                if (found.limiter if found else None) != (kept.cgroup.limiter if kept.cgroup else None):
                    kept.cpu.clear()  # another cgroup's counters: never subtracted from this one's
                kept.cgroup = found
            stat = kept.cgroup.cpu_stat() if kept.cgroup else None
            if stat is not None:
                kept.cpu.append((mono, stat))
            kept.trim(mono)

    def __bool__(self) -> bool:
        return bool(self._ranks)

    def views(
        self,
        first: Mapping[ProcessId, tuple[int, int, int, int]],
        last: Mapping[ProcessId, tuple[int, int, int, int]],
        window_s: float,
    ) -> tuple[RankView, ...]:
        """Each rank over the window; `first`/`last`: the speed watch's reads at its ends (schedstat's
        run and wait, its switches, its major faults)."""
        found = []
        for ident, kept in sorted(self._ranks.items(), key=lambda kv: kv[1].rank):
            e1, d1, _, f1 = last.get(ident, (0, 0, 0, 0))
            e0, d0, _, f0 = first.get(ident, (0, 0, 0, 0))
            ran, waited = max(e1 - e0, 0) / 1e9, max(d1 - d0, 0) / 1e9
            found.append(
                RankView(
                    **self._where(kept),
                    step=kept.steps[-1][1] if kept.steps else None,
                    rate=_rate(kept.steps),
                    cpu_used=ran / window_s if window_s > 0 else 0.0,
                    wait_share=waited / (ran + waited) if ran + waited > 0 else 0.0,
                    # a rank born in the window: its faults since its start are its imports', not its memory's
                    majflt_per_s=max(f1 - f0, 0) / window_s if window_s > 0 and ident in first else 0.0,
                    **self._quota(kept),
                    gpu=self._gpus.get(kept.pid),
                    recorder=self._waits.get(kept.rank),
                    last_call=kept.last_call,
                    call_rate=kept.call_rate(),
                )
            )
        return tuple(found)

    def note_gpus(self, views: Sequence[RankView]) -> None:
        """The GPU each rank computes on, as the speed watch last read NVML (every judgement): its
        view carries it until the next, and its row shows it."""
        self._gpus = {r.pid: r.gpu for r in views if r.gpu is not None}

    def rows(self, node: str | None = None) -> list[dict[str, Any]]:
        """`status --json`'s `ranks` (store.rankfile keeps them for the frontends); `node`: this
        machine as the engine names it (as a group's records do), else its host name."""
        return [
            {
                "rank": v.rank,
                "local_rank": v.local_rank,
                "node": node,
                "group_rank": v.node,
                "pid": v.pid,
                "step": v.step,
                "rate": None if v.rate is None else round(v.rate, 3),
                "where": v.where,
                "where_detail": v.where_detail,
                "shares": {w: round(s, 2) for w, s in v.shares},
                "gpu": _gpu_row(v.gpu),
                "collective": _call_row(v),
            }
            for v in self.views({}, {}, 0.0)
        ]

    def _where(self, kept: _Rank) -> dict[str, Any]:
        counts = dict.fromkeys(WHERE, 0)
        details: dict[str, dict[str, int]] = {"idle": {}, "data": {}}
        for _, where, detail in kept.looks:
            counts[where] += 1
            if where in details:
                details[where][detail] = details[where].get(detail, 0) + 1
        n = len(kept.looks)
        older, newer = list(kept.looks)[: n // 2], list(kept.looks)[n // 2 :]
        halves = (_collective(older), _collective(newer)) if older else None
        shares = tuple(sorted(((w, c / n) for w, c in counts.items() if c), key=lambda ws: -ws[1]))
        last = kept.looks[-1] if kept.looks else (0.0, "unknown", "")
        return {
            "rank": kept.rank,
            "pid": kept.pid,
            "local_rank": kept.local_rank,
            "node": kept.node,
            "looks": n,
            "shares": shares,
            "halves": halves,
            "where": last[1],
            "where_detail": last[2],
            "idle_detail": _most(details["idle"]),
            "data_detail": _most(details["data"]),
        }

    def _quota(self, kept: _Rank) -> dict[str, Any]:
        cg = kept.cgroup
        if cg is None or cg.quota_cpus is None or len(kept.cpu) < 2:
            return {}
        before, after = kept.cpu[0][1], kept.cpu[-1][1]
        periods = after.nr_periods - before.nr_periods
        share = (after.nr_throttled - before.nr_throttled) / periods if periods > 0 else 0.0
        return {"quota_cpus": cg.quota_cpus, "throttled_share": share}


def ranks_on_gpus(
    ranks: Sequence[RankView], clocks: Sequence[GpuClock], held: Sequence[GpuProcess]
) -> tuple[RankView, ...]:
    """Each rank with the GPU its own process computes on (NVML's compute processes): a straggler's GPU
    is its why only if it is that rank's. A rank on several GPUs gets the one whose clock is furthest
    below its most."""
    by_index = {c.gpu_index: c for c in clocks}
    found = []
    for r in ranks:
        mine = [by_index[p.gpu_index] for p in held if p.pid == r.pid and p.gpu_index in by_index]
        slowest = min(mine, key=lambda c: c.sm_mhz / c.sm_max_mhz if c.sm_max_mhz else 1.0, default=None)
        found.append(replace(r, gpu=slowest))  # None: it holds none now, whatever it held before
    return tuple(found)


def rank_of(member: Member, hook_ranks: Mapping[int, int] | None = None) -> int | None:
    """Its rank: from its launcher's variables (model.ranks_from), else as the hooks' records name it."""
    if member.ranks is not None and member.ranks.rank is not None:
        return member.ranks.rank
    return hook_ranks.get(member.pid) if hook_ranks else None


def rank_processes(members: Iterable[Member], hook_ranks: Mapping[int, int] | None = None) -> list[Member]:
    """The processes that are a rank: they carry one that their parent does not (a rank's children
    inherit its variables), lowest rank first, at most MAX_RANKS."""
    members = list(members)
    by_pid = {m.pid: m for m in members}
    found: list[tuple[int, Member]] = []
    for m in members:
        rank = rank_of(m, hook_ranks)
        if rank is None:
            continue
        parent = by_pid.get(m.ppid)
        if parent is not None and rank_of(parent, hook_ranks) == rank:
            continue
        found.append((rank, m))
    found.sort(key=lambda rm: (rm[0], rm[1].pid))
    return [m for _, m in found[:MAX_RANKS]]


def _ranked(members: list[Member], hook_ranks: Mapping[int, int] | None) -> list[tuple[Member, int]]:
    return [(m, r) for m in rank_processes(members, hook_ranks) if (r := rank_of(m, hook_ranks)) is not None]


def _gpu_row(c: GpuClock | None) -> dict[str, Any] | None:
    if c is None:
        return None
    limits = [name for bit, name in LIMITS.items() if c.reasons & bit]
    return {
        "index": c.gpu_index,
        "sm_mhz": c.sm_mhz,
        "sm_max_mhz": c.sm_max_mhz,
        "utilization": c.utilization,
        "limits": limits,  # what holds its clock back (NVML's clock event reasons that are limits)
    }


def _called_at(a: Arrival) -> int:
    return a.created_ns


def _call_row(v: RankView) -> dict[str, Any] | None:
    """The newest collective the rank's recorder named: its number in its group, its op, when it was
    called, and the rank's collectives a second (Ray's hang detector shows the counts alike)."""
    c = v.last_call
    if c is None:
        return None
    rate = None if v.call_rate is None else round(v.call_rate, 2)
    return {"group": c.group, "seq": c.seq, "op": c.op, "at": round(c.created_ns / 1e9, 3), "rate": rate}


def _call_name(number: int | None, names: dict[int, str]) -> str | None:
    if number is None:
        return None
    return "running" if number == RUNNING else names.get(number, f"syscall {number}")


def _collective(looks: list[tuple[float, str, str]]) -> float:
    return sum(where == "collective" for _, where, _ in looks) / len(looks)


def _most(seen: dict[str, int]) -> str:
    return max(seen, key=lambda d: seen[d]) if seen else ""


def _rate(steps: deque[tuple[float, int]]) -> float | None:
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return None
    return (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])

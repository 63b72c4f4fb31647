"""`straggler` across the nodes of a distributed job (docs/cluster.md, "Stragglers across nodes").

Each node's shim watches only its own ranks (shim.watch.rankwatch); under Slurm a node's ranks may be all of
one side of the comparison, or a single rank. So each shim publishes its ranks' views of the last window
(`node_document`, written to the group directory by shim.record.groupsink), and `explain --group` merges the
nodes' documents and asks the very rule a single shim asks (rules.speed.ranks.straggler) about all the
ranks at once. The why comes from the straggler's own node (its quota, its throttling, the processes
that shared its CPUs, its faults, its GPU's clock): a second judgement gives the rule that node's
neighbours. What was compared is said too (GroupRanks: the span of the windows, the nodes left out as
stale), found or not, and after the end, when the documents are the job's last windows.

A document comes from a shared directory: every field is checked before it becomes a RankView, and one
that fails is left out whole."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from jobwarden.model import Finding
from jobwarden.rules.speed.evidence import GpuClock, Neighbour, RankView, SpeedEvidence
from jobwarden.rules.speed.ranks import MIN_LOOKS, WHERE, straggler

FORMAT_VERSION = 1
MAX_RANKS = 64  # rank views read of one node's document (a shim writes at most rankwatch.MAX_RANKS)
MAX_NEIGHBOURS = 3  # processes outside the job named of one node: the rule names the first
CMDLINE_CHARS = 60  # as the rule shows a neighbour's command line
DETAIL_CHARS = 200  # a frame or a system call
MAX_GPUS = 1 << 10  # a GPU index a shim may write
MAX_MHZ = 100_000  # a clock a GPU may report (today's run below 3 GHz)
SAME_WINDOW_S = 30.0  # nodes whose documents are further apart than this do not speak of one window


@dataclass(frozen=True)
class NodeRanks:
    """One node's document: its ranks over the window that ended at `wall`."""

    node: str
    wall: float
    window_s: float
    ranks: tuple[RankView, ...]
    neighbours: tuple[Neighbour, ...] = ()


@dataclass(frozen=True)
class GroupStraggler:
    """The straggler of the whole group: the rule's finding, with the node its rank runs on."""

    finding: Finding
    node: str
    pid: int
    at: float  # when that node's window ended (wall clock)
    nodes: int  # the nodes whose ranks were compared


def node_document(
    node: str, wall: float, window_s: float, ranks: Sequence[RankView], neighbours: Sequence[Neighbour]
) -> dict[str, Any]:
    """What a node's shim publishes: its ranks' views, and who else used its CPUs, cut to size."""
    return {
        "v": FORMAT_VERSION,
        "node": node,
        "wall": wall,
        "window_s": window_s,
        "ranks": [_view_json(r) for r in ranks[:MAX_RANKS]],
        "neighbours": [
            {**asdict(n), "cmdline": n.cmdline[:CMDLINE_CHARS]} for n in neighbours[:MAX_NEIGHBOURS]
        ],
    }


def _view_json(r: RankView) -> dict[str, Any]:
    # not its flight recorder's waits: they compare the ranks of one node, by that node's clock
    view = asdict(replace(r, recorder=None, last_call=None, call_rate=None))
    for name in ("recorder", "last_call", "call_rate"):
        del view[name]
    view["shares"] = [[w, s] for w, s in r.shares]
    view["halves"] = list(r.halves) if r.halves is not None else None
    for name in ("where_detail", "idle_detail", "data_detail"):
        view[name] = view[name][:DETAIL_CHARS]
    return view


def node_ranks(doc: Mapping[str, Any]) -> NodeRanks | None:
    """A node's document as the rule reads it; None when any field is not what a shim writes."""
    node, wall, window = doc.get("node"), doc.get("wall"), doc.get("window_s")
    ranks, neighbours = doc.get("ranks"), doc.get("neighbours", [])
    if not isinstance(node, str) or not _number(wall) or not _number(window) or float(window) < 0:  # type: ignore[arg-type]
        return None
    if not isinstance(ranks, list) or not isinstance(neighbours, list):
        return None
    views = [_view_of(r) for r in ranks[:MAX_RANKS]]
    near = [_neighbour_of(n) for n in neighbours[:MAX_NEIGHBOURS]]
    if any(v is None for v in views) or any(n is None for n in near):
        return None
    return NodeRanks(
        node,
        float(wall),  # type: ignore[arg-type]
        float(window),  # type: ignore[arg-type]
        tuple(v for v in views if v is not None),
        tuple(n for n in near if n is not None),
    )


@dataclass(frozen=True)
class GroupRanks:
    """What the nodes' last rank views say together: the span they cover, how many ranks the rule could
    judge, the nodes left out as speaking of another time, and the straggler if there is one. After the
    job's end these are its last windows: `explain --group` says so with their span."""

    nodes: tuple[str, ...]  # the nodes whose ranks were compared
    ranks: int  # the ranks compared
    judged: int  # of them, those looked at often enough for the rule (rules.speed.ranks.MIN_LOOKS)
    since: float  # wall clock: the start of the oldest compared window
    until: float  # wall clock: the end of the newest
    stale: tuple[tuple[str, float], ...] = ()  # (node, the end of its last window): left out, too old
    straggler: GroupStraggler | None = None


def group_straggler(nodes: Sequence[NodeRanks]) -> GroupStraggler | None:
    found = group_ranks(nodes)
    return found.straggler if found is not None else None


def group_ranks(nodes: Sequence[NodeRanks]) -> GroupRanks | None:
    """The rule over the ranks of every node whose window is the newest's (a node that stopped
    publishing long ago speaks of another time); a rank seen by two nodes counts once, as the newer saw it."""
    if not nodes:
        return None
    newest = max(n.wall for n in nodes)
    recent = sorted((n for n in nodes if n.wall >= newest - SAME_WINDOW_S), key=lambda n: n.wall)
    stale = tuple(sorted((n.node, n.wall) for n in nodes if n.wall < newest - SAME_WINDOW_S))
    where: dict[int, NodeRanks] = {}
    views: dict[int, RankView] = {}
    for n in recent:  # oldest first: the newer document's view of a rank wins
        for r in n.ranks:
            views[r.rank], where[r.rank] = r, n
    compared = GroupRanks(
        nodes=tuple(sorted({where[r].node for r in views})),
        ranks=len(views),
        judged=sum(1 for r in views.values() if r.looks >= MIN_LOOKS),
        since=min(n.wall - n.window_s for n in recent),
        until=newest,
        stale=stale,
    )
    ev = _evidence(list(views.values()), max(n.window_s for n in recent), ())
    found = straggler(ev)
    slow = found.rank if found is not None else None
    if found is None or slow is None or slow not in where:
        return compared
    home = where[slow]
    if home.neighbours:  # again, with what the straggler's own node saw of who shared its CPUs
        found = straggler(_evidence(list(views.values()), ev.window_s, home.neighbours)) or found
    named = GroupStraggler(found, home.node, views[slow].pid, home.wall, len(compared.nodes))
    return replace(compared, straggler=named)


def _evidence(ranks: list[RankView], window_s: float, neighbours: tuple[Neighbour, ...]) -> SpeedEvidence:
    # the rule reads the ranks, the neighbours and the GPU clocks; the job-wide counters are no one node's
    return SpeedEvidence(
        window_s=window_s,
        cpus=1.0,
        affinity_cpus=1,
        ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        neighbours=neighbours,
    )


def _view_of(raw: object) -> RankView | None:
    if not isinstance(raw, dict):
        return None
    try:
        shares = tuple((str(w), float(s)) for w, s in raw["shares"])
        halves = raw.get("halves")
        view = RankView(
            rank=raw["rank"],
            pid=raw["pid"],
            local_rank=raw.get("local_rank"),
            node=raw.get("node"),
            looks=raw["looks"],
            shares=shares,
            halves=(float(halves[0]), float(halves[1])) if halves is not None else None,
            where=raw.get("where", "unknown"),
            where_detail=raw.get("where_detail", ""),
            step=raw.get("step"),
            rate=raw.get("rate"),
            cpu_used=raw.get("cpu_used", 0.0),
            wait_share=raw.get("wait_share", 0.0),
            quota_cpus=raw.get("quota_cpus"),
            throttled_share=raw.get("throttled_share"),
            idle_detail=raw.get("idle_detail", ""),
            data_detail=raw.get("data_detail", ""),
            gpu=_gpu_of(raw.get("gpu")),
            majflt_per_s=raw.get("majflt_per_s", 0.0),
        )
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return view if _sound(view) else None


def _gpu_of(raw: object) -> GpuClock | None:
    """A rank's GPU as its shim read it from NVML: absent, or every field whole and in range (a clock in
    MHz below MAX_MHZ, a utilisation in percent); anything else refuses the document."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError("gpu")
    index, mhz, most, reasons, used = (
        raw.get(k) for k in ("gpu_index", "sm_mhz", "sm_max_mhz", "reasons", "utilization")
    )
    if not (_natural(index) and _natural(mhz) and _natural(most) and _natural(reasons)):
        raise TypeError("gpu")
    if index >= MAX_GPUS or mhz >= MAX_MHZ or most >= MAX_MHZ:  # type: ignore[operator]
        raise ValueError("gpu")
    if used is not None and not (_number(used) and 0.0 <= used <= 100.0):
        raise ValueError("gpu")
    return GpuClock(index, mhz, most, reasons, None if used is None else float(used))  # type: ignore[arg-type]


def _sound(v: RankView) -> bool:
    """Every field of the type and range a shim writes: a share is a fraction, a count is whole."""
    counts = (v.rank, v.pid, v.looks)
    optional_counts = (v.local_rank, v.node, v.step)
    fractions = [s for _, s in v.shares] + list(v.halves or ()) + [v.wait_share]
    texts = (v.where, v.where_detail, v.idle_detail, v.data_detail)
    return (
        all(_natural(c) for c in counts)
        and all(c is None or _natural(c) for c in optional_counts)
        and all(w in WHERE for w, _ in v.shares)
        and len(v.shares) <= len(WHERE)
        and all(_number(s) and 0.0 <= s <= 1.0 for s in fractions)
        and (v.throttled_share is None or (_number(v.throttled_share) and 0.0 <= v.throttled_share <= 1.0))
        and all(x is None or _number(x) for x in (v.rate, v.quota_cpus))
        and _number(v.cpu_used)
        and _number(v.majflt_per_s)
        and v.majflt_per_s >= 0.0
        and all(isinstance(t, str) and len(t) <= DETAIL_CHARS for t in texts)
    )


def _neighbour_of(raw: object) -> Neighbour | None:
    if not isinstance(raw, dict):
        return None
    pid, user, cpu, cmdline, job_id = (raw.get(k) for k in ("pid", "user", "cpu", "cmdline", "job_id"))
    if not (_natural(pid) and isinstance(user, str) and _number(cpu) and isinstance(cmdline, str)):
        return None
    if job_id is not None and not _natural(job_id):
        return None
    return Neighbour(pid, user[:64], float(cpu), cmdline[:CMDLINE_CHARS], job_id)  # type: ignore[arg-type]


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

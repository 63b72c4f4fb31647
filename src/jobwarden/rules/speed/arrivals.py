"""Who the other ranks wait for, from when each rank called its collectives: its flight recorder, polled by
the rank watch (shim.watch.rankwatch; the hooks answer with `time_created_ns` of each entry, and
`duration_ms` where torch times the collective on the device).

A rank that calls collective s later than the others makes each of them wait from its own call until its:
their wait at s is the latest call less their own. The ranks compared share a node, so they share the wall
clock torch reads. From its call of s to its call of s+1 a rank waits in s, then computes: the share of
those intervals it spent waiting is what the looks at its main thread estimate (rules.speed.ranks),
measured instead of sampled, and whatever its main thread does meanwhile. Only over the time those
intervals span, though (`covered_s`): a poll's answer holds the recorder's last 256 collectives, an eighth
of a second where a step takes half a millisecond. A rank whose main thread waits on work of its own
(another thread, its GPU's stream) looks blocked like the others, yet the others wait for it. That holds
for calls that block their caller until every rank has called; an asynchronous one (DDP's buckets) does
not wait there, so the rule takes these waits as who is waited for, and their length at most as the looks
found the rank blocked (rules.speed.ranks._recorded_wait).

Where torch times each collective on the device (NCCL with TORCH_NCCL_ENABLE_TIMING=1), its duration on a
rank is that rank's wait plus the transfer that all share: the rank's wait is its duration less the
shortest. That sees a rank whose GPU is slow: it may call its collectives as early as the others (its CPU
runs ahead of its GPU), and its GPU reaches them last."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobwarden.observations import Arrival
from jobwarden.rules.speed.evidence import RecorderWaits

MIN_INTERVALS = 8  # intervals between consecutive collectives, per rank: fewer say nothing

Key = tuple[str, int]  # (group, seq)


def waits(calls: Mapping[int, Sequence[Arrival]]) -> dict[int, RecorderWaits]:
    """Each rank's waits over the collectives that every rank in `calls` (rank: its arrivals) called with
    one signature; {} for fewer than two ranks or MIN_INTERVALS intervals each. A collective whose op
    differs between ranks is left out: that is the hang rules' (rules.hang.desync), not a step."""
    if len(calls) < 2:
        return {}
    by_rank = {rank: {(a.group, a.seq): a for a in found} for rank, found in calls.items()}
    keys = sorted(set.intersection(*(set(d) for d in by_rank.values())))
    keys = [k for k in keys if len({d[k].op for d in by_rank.values()}) == 1]
    # torch gives a duration once a collective has ended: the newest, still running on the slow rank, have
    # none. The timed ones decide where they are enough; else when each was called.
    timed = [k for k in keys if all(d[k].duration_ms is not None for d in by_rank.values())]
    if len(timed) > MIN_INTERVALS:
        found = _compare(by_rank, timed, True)
        if found:
            return found
    return _compare(by_rank, keys, False)


def _compare(
    by_rank: Mapping[int, Mapping[Key, Arrival]], keys: list[Key], timed: bool
) -> dict[int, RecorderWaits]:
    """The waits over `keys`, by the device's durations or by when each was called; {} where a rank has
    fewer than MIN_INTERVALS intervals."""
    waited = {k: _waited_at(k, by_rank, timed) for k in keys}
    longest = {k: max(w.values()) for k, w in waited.items()}
    shortest = {k: min(w.values()) for k, w in waited.items()}
    found = {}
    for rank, mine in by_rank.items():
        # (when it called s, its wait at s, until it called s+1): the interval it computed and waited in
        intervals = []
        for k in keys:
            after = mine.get((k[0], k[1] + 1))
            if after is not None and (k[0], k[1] + 1) in waited and after.created_ns > mine[k].created_ns:
                start = mine[k].created_ns
                intervals.append((start, waited[k][rank], after.created_ns - start))
        if len(intervals) < MIN_INTERVALS:
            return {}
        intervals.sort()
        half = len(intervals) // 2
        found[rank] = RecorderWaits(
            share=_share(intervals),
            halves=(_share(intervals[:half]), _share(intervals[half:])),
            late_ms=sum(longest[k] - waited[k][rank] for k in keys) / len(keys) / 1e6,
            last=sum(waited[k][rank] == shortest[k] for k in keys),
            compared=len(keys),
            timed=timed,
            covered_s=sum(length for *_, length in intervals) / 1e9,
        )
    return found


def _waited_at(key: Key, by_rank: Mapping[int, Mapping[Key, Arrival]], timed: bool) -> dict[int, float]:
    """Each rank's wait at one collective, in nanoseconds."""
    if timed:
        durations = {rank: float(d[key].duration_ms or 0.0) * 1e6 for rank, d in by_rank.items()}
        shortest = min(durations.values())
        return {rank: ns - shortest for rank, ns in durations.items()}
    called = {rank: d[key].created_ns for rank, d in by_rank.items()}
    latest = max(called.values())
    return {rank: float(latest - ns) for rank, ns in called.items()}


def _share(intervals: Sequence[tuple[int, float, int]]) -> float:
    total = sum(length for _, _, length in intervals)
    return min(sum(min(wait, length) for _, wait, length in intervals) / total, 1.0) if total else 0.0

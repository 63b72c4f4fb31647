"""Which rank the others wait for, from each rank's PyTorch flight recorder: the first collective where the
ranks' sequences part.

In a process group every rank numbers its collectives (torch's collective_seq_id): rank r's call #n must meet
every other rank's #n, with the same op and the same tensor shapes. Walking the numbers up from the oldest
that every rank still holds, the first number where the ranks disagree is where the job went wrong (NVRx's
fr_attribution calls it the wavefront):

- a rank with no call there never made it: it is behind (computing, loading data, stuck outside any
  collective) or it skipped one, and the others wait for it;
- ranks that called another op or another shape there took another code path. The fewer of them are the
  odd ones out. With as many ranks on each side (two ranks: one each) the recorder alone cannot say which
  side strayed; the side whose call repeats the collective every rank made last is taken as the expected one
  (a training step repeats its collectives: the rank that breaks the pattern is the one that took the other
  branch), then the side that calls all_reduce (the collective of every data-parallel step), and the
  finding says it chose (`sure` is False).

A divergence counts only where a rank still waits in its call there (torch did not retire it): recorders
read a moment apart from a job that moves on would otherwise differ by the calls made in between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from jobwarden.observations import CollectiveCall, RankRecorder

DEFAULT_GROUP = "0"  # the default group is the first every rank creates
STEP_OP = "all_reduce"


@dataclass(frozen=True)
class Divergence:
    """The first collective where the ranks of one process group part."""

    group: str  # its name ("0"); `expected.group_desc` says what it was created as
    seq: int
    culprits: tuple[RankRecorder, ...]  # the ranks the others wait for, lowest rank first
    waiting: tuple[RankRecorder, ...]  # the others, in the expected call at `seq`
    expected: CollectiveCall  # the call the waiting ranks made at `seq`
    calls: Mapping[int, CollectiveCall | None]  # by pid: each rank's call at `seq`, None where it made none
    agreed: CollectiveCall | None  # the last call every rank made alike before `seq`
    sure: bool = True  # False: as many ranks on each side, the culprit chosen by the history

    @property
    def missing(self) -> bool:
        """The culprits made no call at `seq` (rather than another one)."""
        return all(self.calls.get(r.pid) is None for r in self.culprits)


def first_divergence(recorders: Sequence[RankRecorder]) -> Divergence | None:
    """The first divergence in the default group, else in the first other group that has one."""
    groups = sorted({c.group for r in recorders for c in r.calls}, key=lambda g: (g != DEFAULT_GROUP, g))
    for group in groups:
        found = _in_group(group, recorders)
        if found is not None:
            return found
    return None


def _in_group(group: str, recorders: Sequence[RankRecorder]) -> Divergence | None:
    by_seq = {r.pid: {c.seq: c for c in r.calls if c.group == group} for r in recorders}
    members = sorted((r for r in recorders if by_seq[r.pid]), key=_order)
    if len(members) < 2:
        return None
    oldest = max(min(by_seq[r.pid]) for r in members)  # below it, some rank's recorder has forgotten
    agreed: CollectiveCall | None = None
    for seq in sorted({s for r in members for s in by_seq[r.pid] if s >= oldest}):
        calls = {r.pid: by_seq[r.pid].get(seq) for r in members}
        made = [c for c in calls.values() if c is not None]
        if len(made) == len(members) and len({c.signature for c in made}) == 1:
            agreed = made[0]
            continue
        return _judge(group, seq, members, calls, agreed)
    return None


def _judge(
    group: str,
    seq: int,
    members: list[RankRecorder],
    calls: dict[int, CollectiveCall | None],
    agreed: CollectiveCall | None,
) -> Divergence | None:
    absent = [r for r in members if calls[r.pid] is None]
    present = [r for r in members if calls[r.pid] is not None]
    sides: dict[tuple[object, ...], list[RankRecorder]] = {}
    for r in present:
        sides.setdefault(calls[r.pid].signature, []).append(r)  # type: ignore[union-attr]
    if absent:  # the ranks that made no call are the ones the others wait for
        expected_side = max(sides.values(), key=len)
        culprits, sure = absent, True
    else:
        expected_side, sure = _expected_side(list(sides.values()), calls, agreed)
        culprits = [r for r in present if r not in expected_side]
    expected = calls[expected_side[0].pid]
    assert expected is not None
    if all(calls[r.pid].done for r in expected_side):  # type: ignore[union-attr]
        return None  # nobody waits there: recorders read while the job moved on
    return Divergence(group, seq, tuple(culprits), tuple(expected_side), expected, calls, agreed, sure)


def _expected_side(
    sides: list[list[RankRecorder]], calls: dict[int, CollectiveCall | None], agreed: CollectiveCall | None
) -> tuple[list[RankRecorder], bool]:
    """The side the other ranks strayed from, and whether the ranks' numbers alone said so."""
    largest = max(len(s) for s in sides)
    tied = [s for s in sides if len(s) == largest]
    if len(tied) == 1:
        return tied[0], True

    def call(side: list[RankRecorder]) -> CollectiveCall:
        found = calls[side[0].pid]
        assert found is not None
        return found

    tests: tuple[Callable[[CollectiveCall], bool], ...] = (
        lambda c: agreed is not None and c.signature == agreed.signature,
        lambda c: agreed is not None and c.op == agreed.op,
        lambda c: c.op == STEP_OP,
    )
    for matches in tests:
        chosen = [s for s in tied if matches(call(s))]
        if len(chosen) == 1:
            return chosen[0], False
    return min(tied, key=lambda s: _order(s[0])), False  # no sign either way: the lowest rank's side


def _order(r: RankRecorder) -> tuple[int, int]:
    return (r.rank if r.rank is not None else 1 << 62, r.pid)

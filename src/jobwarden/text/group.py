"""The text of `explain --group`: the verdict in one line, then one line per rank."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from jobwarden.clock import shown_time
from jobwarden.config import counted, format_duration
from jobwarden.text.sanitize import one_line

if TYPE_CHECKING:
    from jobwarden.control.views.group import GroupView
    from jobwarden.rules.group import RankVerdict


def group_report(view: GroupView) -> Iterator[str]:
    v = view.verdict
    yield verdict_line(view)
    for r in v.ranks:
        at = f" at {clock_time(r.outcome.at)}" if r.outcome.at is not None else ""
        rule = f" [{r.outcome.rule}]" if r.outcome.rule else ""
        yield f"  {who(r)}: {one_line(r.outcome.text)}{at}{one_line(rule)}: {r.role}"
    yield from _rank_views_lines(view)
    if v.missing_nodes:
        missing = one_line(", ".join(v.missing_nodes))
        yield f"  never reported: {missing} (no records from these nodes)"
    if view.torn_lines:
        torn = counted(view.torn_lines, "torn line")
        yield f"  skipped {torn} (a writer died mid-record, or it is still arriving)"
    if view.bad_records:
        bad = counted(view.bad_records, "record")
        yield f"  skipped {bad} jobwarden did not write (a field of the wrong type)"
    for why in view.refused:
        yield f"  left out {one_line(why)}"
    code = view.requeue_code()
    if code is not None:
        yield f"  retryable: --exit-status gives the requeue code {code}"
    yield f"  (records: {one_line(str(view.root))}; clock tolerance {v.clock_tolerance_s:g}s)"


def _rank_views_lines(view: GroupView) -> Iterator[str]:
    """'rank 1 on node n2 (pid 4242) [straggler]: Rank 1 is a straggler: about 2.4× slower…', the why;
    or that the ranks compared have none. After the end, the views are the last windows the nodes
    published: the span is said, as the nodes left out for speaking of an older time."""
    views = view.rank_views
    if views is None:
        return
    ended = view.ended_at
    span = f"{clock_time(views.since)}–{clock_time(views.until)}"
    when = (
        f"in the last views before the job ended at {clock_time(ended)}: {span}"
        if ended is not None
        else f"as of {clock_time(views.until)}, window from {clock_time(views.since)}"
    )
    s = views.straggler
    if s is not None:
        f = s.finding
        yield (
            f"  rank {f.rank} on node {one_line(s.node)} (pid {s.pid}) [straggler]: {one_line(f.title)}"
            f" ({when}, ranks of {counted(s.nodes, 'node')} compared)"
        )
        yield f"    {one_line(f.summary)}"
        if f.remedy:
            yield f"    remedy: {one_line(f.remedy)}"
    elif views.judged >= 2:
        nodes = counted(len(views.nodes), "node")
        yield f"  no straggler among {counted(views.judged, 'rank')} on {nodes} ({when})"
    else:
        yield f"  ranks not compared yet: fewer than 2 looked at long enough ({when})"
    for node, at in views.stale:
        behind = format_duration(views.until - at)
        yield (
            f"  rank views of node {one_line(node)} left out: its last window ended at {clock_time(at)}, "
            f"{behind} before the newest (it stopped publishing)"
        )


def verdict_line(view: GroupView) -> str:
    """'rank 3 on node n2 was OOM-killed at 12:03:07; ranks 0–2 then hung in all_reduce: collateral'."""
    v = view.verdict
    head = f"group {one_line(view.group)} attempt {view.attempt}: "
    if v.root is None:
        return head + {"succeeded": "every rank succeeded", "running": "running, no failure yet"}.get(
            v.state, v.state
        )
    root = v.root
    at = f" at {clock_time(root.outcome.at)}" if root.outcome.at is not None else ""
    line = f"{who(root)} {one_line(root.outcome.text)}{at}"
    if v.simultaneous:
        line += f" (at about the same time: {', '.join(who(r) for r in v.simultaneous)})"
    collateral: dict[str, list[RankVerdict]] = {}
    for r in v.ranks:
        if r.role == "collateral":
            collateral.setdefault(r.outcome.text, []).append(r)
    for text, ranks in collateral.items():
        line += f"; {_ranks_text(ranks)} then {one_line(text)}: collateral"
    return line


def who(r: RankVerdict) -> str:
    story = r.story
    node = f" on node {one_line(str(story.node))}" if story.node else ""
    return (f"rank {story.rank}" if story.rank is not None else "the job") + node


def _ranks_text(ranks: Sequence[RankVerdict]) -> str:
    numbers = sorted(r.story.rank for r in ranks if r.story.rank is not None)
    unnamed = len(ranks) - len(numbers)
    parts = [_span(a, b) for a, b in _runs(numbers)]
    if unnamed:
        parts.append(f"{counted(unnamed, 'node')} of unknown ranks")
    label = "rank" if len(numbers) == 1 and not unnamed else "ranks"
    return f"{label} {', '.join(parts)}" if numbers else parts[0]


def _runs(numbers: list[int]) -> Iterator[tuple[int, int]]:
    start = prev = None
    for n in numbers:
        if start is None:
            start = prev = n
        elif n == prev + 1:  # type: ignore[operator]
            prev = n
        else:
            yield start, prev  # type: ignore[misc]
            start = prev = n
    if start is not None:
        yield start, prev  # type: ignore[misc]


def _span(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}–{b}" if b > a + 1 else f"{a}, {b}"


def clock_time(at: float | None) -> str:
    if at is None:
        return "?"
    return shown_time(at, "ms")

"""`explain --group`: read a distributed job's group records (store.groupdir) and merge them into one
verdict (rules.group); the exit status a batch script asks for with --exit-status."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.clock import iso
from jobwarden.errors import JobwardenError, UsageError
from jobwarden.rules.group import (
    DEFAULT_CLOCK_TOLERANCE_S,
    Cause,
    GroupVerdict,
    RankStory,
    expand_nodelist,
    merge,
)
from jobwarden.rules.speed.acrossnodes import GroupRanks, GroupStraggler, group_ranks, node_ranks
from jobwarden.store import groupdir

SETTLE_S = 15.0  # --exit-status: how long to wait for records the shared file system has not shown yet
SETTLE_POLL_S = 0.5


@dataclass(frozen=True)
class GroupView:
    group: str
    attempt: int
    root: Path  # the attempt's directory
    verdict: GroupVerdict
    requeue_exit: int | None
    max_requeues: int | None
    torn_lines: int
    bad_records: int = 0  # records that were no records (a field of the wrong type), skipped
    refused: tuple[str, ...] = ()  # files and folders that failed the checks of a shared place, skipped
    rank_views: GroupRanks | None = None  # the nodes' last rank views, merged: the straggler across nodes

    @property
    def straggler(self) -> GroupStraggler | None:
        """The rank the others wait for, across the nodes."""
        return self.rank_views.straggler if self.rank_views is not None else None

    @property
    def ended_at(self) -> float | None:
        """When the last rank's end was recorded, once no rank runs (wall clock); None while any runs."""
        outcomes = [r.outcome for r in self.verdict.ranks]
        if not outcomes or any(o.cause == Cause.RUNNING for o in outcomes):
            return None
        ends = [o.at for o in outcomes if o.at is not None]
        return max(ends) if ends else None

    def exit_status(self) -> int:
        """0 when the group succeeded; the requeue code when the root cause is retryable and the attempts
        left allow it; else 1 (docs/cluster.md, "Requeue")."""
        if self.verdict.state == "succeeded":
            return 0
        return self.requeue_code() or 1

    def requeue_code(self) -> int | None:
        if self.requeue_exit is None or not self.verdict.retryable:
            return None
        if self.max_requeues is not None and self.attempt >= self.max_requeues:
            return None
        return self.requeue_exit

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        root = None
        if v.root is not None:
            finding = _finding_of(v.root.story, v.root.outcome.rule)
            root = {
                "rank": v.root.story.rank,
                "node": v.root.story.node,
                "pid": v.root.story.pid,
                "rule": v.root.outcome.rule,
                "at": iso(v.root.outcome.at),
                "finding": finding or v.root.outcome.text,
            }
        return {
            "group": self.group,
            "attempt": self.attempt,
            "state": v.state,
            "root_cause": root,
            "ranks": [
                {
                    "rank": r.story.rank,
                    "node": r.story.node,
                    "role": r.role,
                    "outcome": r.outcome.text,
                    "rule": r.outcome.rule,
                    "at": iso(r.outcome.at),
                    **({} if r.story.rank is not None else {"file": r.story.label}),
                }
                for r in v.ranks
            ],
            "straggler": _straggler_json(self.straggler),
            "rank_views": _rank_views_json(self.rank_views, self.ended_at),
            "missing_nodes": list(v.missing_nodes),
            "clock_tolerance_s": v.clock_tolerance_s,
            "retryable": v.retryable,
            "requeue_exit": self.requeue_code(),
            "torn_lines": self.torn_lines,
            "bad_records": self.bad_records,
            "refused": list(self.refused),
        }


def group_view(
    home: Path,
    group: str,
    attempt: int | None = None,
    group_dir: str | None = None,
    tolerance_s: float | None = None,
    over: bool = False,
    settle_s: float = 0.0,
) -> GroupView:
    """The verdict of one attempt. `over`: the job has ended (a batch script asks after srun), so ranks
    with no end are lost; then wait up to `settle_s` for records a shared file system has not shown yet
    (nodes missing, ends not written), as submitit waits for its results."""
    deadline = time.monotonic() + settle_s
    while True:
        view = _read_view(home, group, attempt, group_dir, tolerance_s, over)
        unsettled = view.verdict.missing_nodes or any(not s.first("ended") for s in _stories(view))
        if not unsettled or time.monotonic() >= deadline:
            return view
        time.sleep(SETTLE_POLL_S)


def _stories(view: GroupView) -> list[RankStory]:
    return [r.story for r in view.verdict.ranks]


def _read_view(
    home: Path, group: str, attempt: int | None, group_dir: str | None, tolerance_s: float | None, over: bool
) -> GroupView:
    root = groupdir.group_root(home, group, group_dir)
    try:
        records = groupdir.read_group(root, attempt)
    except OSError as err:  # the group's or the attempt's folder is another user's, or open to others
        raise JobwardenError(
            f"explain --group {group}: cannot trust the records under {root}: {err}",
            "group records are only believed in folders of yours that others cannot write to: run "
            "as the user who ran the job, or pass --group-dir where its ranks wrote them",
        ) from err
    if records is None or not any(log.records for log in records.ranks):
        which = f"attempt {attempt}" if attempt is not None else "any attempt"
        left_out = (
            f" ({len(records.refused)} left out: {records.refused[0]})" if records and records.refused else ""
        )
        raise UsageError(
            f"explain --group {group}: no records of {which} under {root}{left_out}",
            "check the group id (`ls` that directory), or pass --group-dir where the ranks wrote them",
        )
    recorded = (records.group or {}).get("group")
    if recorded is not None and recorded != group:
        raise UsageError(
            f"explain --group {group}: the records under {root} are those of group {recorded}",
            f"jobwarden explain --group {recorded} --group-dir {root}",
        )
    # a file with no record at all (only torn or bad lines) is no rank
    stories = [RankStory.of(log.name, log.records) for log in records.ranks if log.records]
    expected = set(records.nodes) | set(expand_nodelist((records.group or {}).get("nodelist")))
    tolerance = DEFAULT_CLOCK_TOLERANCE_S if tolerance_s is None else tolerance_s
    verdict = merge(stories, expected, tolerance, over)
    settings = _requeue_settings(records.group, stories)
    refused = list(records.refused)
    nodes = []
    for doc in records.rank_views:
        found = node_ranks(doc)
        if found is None:
            refused.append(f"rank views of node {doc.get('node')!r}: not what a shim writes")
        else:
            nodes.append(found)
    return GroupView(
        group,
        records.attempt,
        groupdir.attempt_dir(root, records.attempt),
        verdict,
        *settings,
        sum(log.torn for log in records.ranks),
        records.bad_records,
        tuple(refused),
        group_ranks(nodes),
    )


def _requeue_settings(
    group: dict[str, Any] | None, stories: list[RankStory]
) -> tuple[int | None, int | None]:
    """--requeue-exit and --max-requeues as the ranks were started with them (group.json, else a rank's)."""
    sources = [group or {}, *(s.first("started") or {} for s in stories)]
    code = next((d["requeue_exit"] for d in sources if isinstance(d.get("requeue_exit"), int)), None)
    most = next((d["max_requeues"] for d in sources if isinstance(d.get("max_requeues"), int)), None)
    return code, most


def _straggler_json(found: GroupStraggler | None) -> dict[str, Any] | None:
    if found is None:
        return None
    f = found.finding
    return {
        "rank": f.rank,
        "node": found.node,
        "pid": found.pid,
        "rule": f.rule,
        "severity": f.severity,
        "title": f.title,
        "summary": f.summary,
        "evidence": list(f.evidence),
        "remedy": f.remedy,
        "pids": list(f.pids),
        "at": iso(found.at),
        "nodes_compared": found.nodes,
    }


def _rank_views_json(views: GroupRanks | None, ended_at: float | None) -> dict[str, Any] | None:
    """The span the straggler's judgement covers: after the end, the last windows the nodes published."""
    if views is None:
        return None
    return {
        "nodes_compared": list(views.nodes),
        "ranks": views.ranks,
        "judged": views.judged,
        "from": iso(views.since),
        "to": iso(views.until),
        "stale_nodes": [{"node": node, "to": iso(at)} for node, at in views.stale],
        "job_ended": iso(ended_at) if ended_at is not None else None,
    }


def _finding_of(story: RankStory, rule: str | None) -> str | None:
    """The title of the rank's own finding of that rule, as its node's shim recorded it."""
    found = [f for f in story.by_kind.get("finding", ()) if f.get("rule") == rule and f.get("title")]
    return str(found[-1]["title"]) if found else None

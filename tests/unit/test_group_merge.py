"""The group verdict (rules.group, control.views.group, text.group) on recorded group directories
(tests/fixtures/groups, built by make_groups.py): causal class first, clocks only inside a class."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from jobwarden.control.views.group import GroupView, group_view
from jobwarden.errors import UsageError
from jobwarden.rules.group import RankStory, classify, expand_nodelist, merge
from jobwarden.store.groupdir import read_rank_log
from jobwarden.text.group import group_report, verdict_line

FIXTURES = Path(__file__).parent.parent / "fixtures" / "groups"


@pytest.fixture(autouse=True, scope="module")
def _closed_to_others() -> None:
    """The recorded group folders as writers leave them: a reader refuses a folder or file that others
    may write to (osapi.sharedfiles), and a checkout made with umask 002 is group-writable (git keeps only
    the execute bit, so this changes nothing it tracks)."""
    for path in [FIXTURES, *FIXTURES.rglob("*")]:
        mode = path.stat().st_mode & 0o7777
        if mode & 0o022:
            path.chmod(mode & ~0o022)


def view(name: str, tmp_path: Path, tolerance: float | None = None) -> GroupView:
    return group_view(tmp_path, "g", None, str(FIXTURES / name), tolerance)


def roles(v: GroupView) -> dict[int | None, str]:
    return {r.story.rank: r.role for r in v.verdict.ranks}


def test_the_oom_rank_is_the_root_and_the_hung_and_torn_down_ranks_are_collateral(tmp_path: Path) -> None:
    v = view("oom-hang", tmp_path)
    doc = v.to_json()
    assert doc["state"] == "failed"
    assert doc["root_cause"]["rank"] == 3 and doc["root_cause"]["node"] == "n2"
    assert doc["root_cause"]["rule"] == "oom-kill" and doc["root_cause"]["pid"] == 32040
    assert roles(v) == {0: "collateral", 1: "collateral", 2: "collateral", 3: "root"}
    assert doc["missing_nodes"] == [] and doc["clock_tolerance_s"] == 2.0
    assert set(doc) >= {"group", "attempt", "state", "root_cause", "ranks", "missing_nodes"}
    assert set(doc["root_cause"]) == {"rank", "node", "pid", "rule", "at", "finding"}
    assert all(set(r) >= {"rank", "node", "role", "outcome", "at"} for r in doc["ranks"])
    line = verdict_line(v)
    assert line.startswith("rank 3 on node n2 was OOM-killed at ")
    assert "ranks 0, 1 then hung in all_reduce: collateral" in line
    assert "rank 2 then was killed by SIGTERM: collateral" in line
    assert v.exit_status() == 1  # an OOM is never retryable


def test_a_clock_running_ahead_does_not_change_the_story(tmp_path: Path) -> None:
    """n2's clock is 30 s ahead: by wall time its OOM comes after n1's hang, yet the OOM is the root."""
    v = view("clock-skew", tmp_path)
    assert v.verdict.root is not None and v.verdict.root.story.rank == 3
    root_at = v.verdict.root.outcome.at
    hung_at = next(r.outcome.at for r in v.verdict.ranks if r.story.rank == 0)
    assert root_at is not None and hung_at is not None and root_at > hung_at  # the clocks disagree
    assert roles(v)[0] == "collateral"


def test_a_node_that_never_reported_is_listed_missing(tmp_path: Path) -> None:
    v = view("missing-node", tmp_path)
    assert v.to_json()["missing_nodes"] == ["n3"]
    assert any("never reported: n3" in line for line in group_report(v))


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    log = read_rank_log(FIXTURES / "torn-line" / "attempt-0" / "ranks" / "rank-1.jsonl")
    assert (len(log.records), log.torn) == (2, 1)
    v = view("torn-line", tmp_path)
    assert v.torn_lines == 1
    assert v.verdict.root is not None and v.verdict.root.outcome.rule == "python-exception"
    assert roles(v) == {0: "root", 1: "unknown"}  # rank 1 wrote recently: still running, not lost


def test_with_nobody_dead_the_rank_elsewhere_leads_the_hang(tmp_path: Path) -> None:
    v = view("hang-leader", tmp_path)
    assert v.verdict.root is not None and v.verdict.root.story.rank == 1  # not the earliest judged (rank 2)
    assert roles(v) == {0: "collateral", 1: "root", 2: "collateral"}
    assert v.exit_status() == 1


def test_a_rank_killed_from_outside_is_retryable(tmp_path: Path) -> None:
    v = view("killed-externally", tmp_path)
    assert v.to_json()["root_cause"]["rule"] == "killed-externally"
    assert v.verdict.retryable and v.exit_status() == 200


def test_a_silent_node_is_lost_and_retryable(tmp_path: Path) -> None:
    v = view("node-lost", tmp_path)
    assert v.verdict.root is not None and v.verdict.root.outcome.rule == "node-lost"
    assert roles(v) == {0: "collateral", 1: "root"}
    assert v.exit_status() == 200


def test_an_engine_stop_is_the_verdict_only_when_nothing_came_first(tmp_path: Path) -> None:
    v = view("engine-stop", tmp_path)
    assert v.verdict.state == "stopped"
    assert v.to_json()["root_cause"]["rule"] == "cancelled-by-engine"
    assert "stopped by the engine (TIMEOUT)" in verdict_line(v)
    assert v.exit_status() == 1


def test_a_group_that_succeeded_exits_0(tmp_path: Path) -> None:
    v = view("succeeded", tmp_path)
    assert (v.verdict.state, v.verdict.root, v.exit_status()) == ("succeeded", None, 0)
    assert verdict_line(v) == "group g attempt 0: every rank succeeded"


def test_max_requeues_reached_gives_no_requeue_code(tmp_path: Path) -> None:
    v = view("killed-externally", tmp_path)
    spent = GroupView(v.group, 3, v.root, v.verdict, 200, 3, 0)
    assert (spent.requeue_code(), spent.exit_status()) == (None, 1)


def test_an_unknown_group_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no records"):
        group_view(tmp_path, "nope", None, str(tmp_path / "nowhere"))


def record(kind: str, wall: float, boot: str = "b", mono: float | None = None, **data: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "rank": data.pop("rank", 0),
        "node": "n",
        "wall": wall,
        "mono": mono or wall,
        "boot_id": boot,
        **data,
    }


def death(rank: int, wall: float, boot: str, mono: float, **data: Any) -> RankStory:
    ended = record("ended", wall, boot, mono, rank=rank, died_at=wall, exit_code=1, signal=None, **data)
    return RankStory.of(f"rank-{rank}", [ended])


def test_within_the_tolerance_one_boot_orders_by_its_monotonic_clock() -> None:
    """Two own deaths 0.5 s apart by wall time, the other way round by one machine's monotonic clock."""
    a = death(0, 100.0, "same", 50.0)
    b = death(1, 100.5, "same", 49.0)
    assert merge([a, b]).root is not None and merge([a, b]).root.story is b  # type: ignore[union-attr]
    c = death(1, 100.5, "other", 49.0)  # two machines: their monotonic clocks do not compare
    verdict = merge([a, c])
    assert verdict.root is not None and verdict.root.story is a
    assert [r.story.rank for r in verdict.simultaneous] == [1]


def test_an_exception_that_says_a_peer_went_away_is_collateral() -> None:
    lost = death(0, 10.0, "b", 10.0, exception="RuntimeError: [../gloo/transport] Connection reset by peer")
    assert classify(lost).cause.name == "COLLATERAL"
    own = death(1, 11.0, "b", 11.0, exception="ValueError: bad batch @ train.py:3")
    assert classify(own).cause.name == "OWN" and classify(own).rule == "python-exception"


def test_slurm_node_lists_expand() -> None:
    assert expand_nodelist("n[1-3,7],gpu-a[01-02],login") == [
        "n1",
        "n2",
        "n3",
        "n7",
        "gpu-a01",
        "gpu-a02",
        "login",
    ]
    assert expand_nodelist(None) == []


def test_a_launcher_nodes_own_file_gives_way_to_its_ranks() -> None:
    """Before torchrun's workers appear the node writes to node-<host>.jsonl; once ranks speak, they tell."""
    early = RankStory.of("node-n", [{**record("alive", 1.0), "rank": None}])
    rank = death(0, 10.0, "b", 10.0, exception="ValueError: x")
    verdict = merge([early, rank])
    assert [r.story.label for r in verdict.ranks] == ["rank-0"]
    alone = merge([RankStory.of("node-m", [{**record("alive", 1.0), "rank": None, "node": "m"}]), rank])
    assert len(alone.ranks) == 2  # another node whose ranks are unknown stays


def test_records_of_another_group_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="those of group g"):
        group_view(tmp_path, "other", None, str(FIXTURES / "oom-hang"))


def hung_rank(
    rank: int, judged: float, last_progress: float | None, op: str | None = "all_reduce"
) -> RankStory:
    hung = record(
        "hung", judged, rank=rank, collective=op, rules=["collective-hang"], last_progress=last_progress
    )
    ended = record(
        "ended", judged + 0.3, rank=rank, died_at=judged + 0.2, end_reason="hung", signal="SIGTERM"
    )
    return RankStory.of(f"rank-{rank}", [hung, ended])


def test_when_every_rank_waits_in_the_collective_the_one_that_stopped_first_leads() -> None:
    """All in all_reduce: the rank whose output stopped first (10 s before the others) leads, though its
    node judged it hung last (its window is longer)."""
    ranks = [hung_rank(0, 100.0, 80.0), hung_rank(1, 101.0, 70.0), hung_rank(2, 99.0, 80.5)]
    verdict = merge(ranks)
    assert verdict.root is not None and verdict.root.story.rank == 1
    unknown = [hung_rank(0, 100.0, None), hung_rank(1, 103.0, 70.0)]  # no progress known: judged first
    assert merge(unknown).root is not None and merge(unknown).root.story.rank == 0  # type: ignore[union-attr]


def test_once_the_job_is_over_a_rank_without_an_end_is_lost(tmp_path: Path) -> None:
    """--exit-status is asked after srun returned: rank 1 never wrote its end, after a moment's wait for
    the shared file system it counts as a lost node (retryable), not as running."""
    began = time.monotonic()
    v = group_view(tmp_path, "g", None, str(FIXTURES / "torn-line"), over=True, settle_s=0.3)
    assert time.monotonic() - began >= 0.3  # it waited for the missing end
    assert v.verdict.state == "failed"
    assert {r.story.rank: r.outcome.rule for r in v.verdict.ranks} == {0: "python-exception", 1: "node-lost"}
    live = group_view(tmp_path, "g", None, str(FIXTURES / "torn-line"))
    assert {r.story.rank: r.role for r in live.verdict.ranks} == {0: "root", 1: "unknown"}


def test_a_slurm_tasks_file_gives_way_to_its_launchers_ranks() -> None:
    """`srun --ntasks-per-node=1 jobwarden run -- torchrun …`: SLURM_PROCID 1 is a node, not rank 1."""
    task = RankStory.of(
        "task-1", [{**record("started", 1.0, rank=1), "rank_from": "slurm-task", "node": "n2"}]
    )
    worker = RankStory.of(
        "rank-1", [{**record("ended", 9.0, rank=1), "node": "n1", "died_at": 9.0, "exit_code": 1}]
    )
    other = RankStory.of(
        "rank-3", [{**record("ended", 9.0, rank=3), "node": "n2", "died_at": 9.0, "exit_code": 0}]
    )
    assert [r.story.label for r in merge([task, worker, other]).ranks] == ["rank-1", "rank-3"]
    alone = merge([task])  # `srun -n 2 jobwarden run -- python train.py`: the task is the rank
    assert [(r.story.rank, r.story.node) for r in alone.ranks] == [(1, "n2")]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--group", "../x"], "--group"),
        (["--group", "x", "--attempt", "-1"], "--attempt"),
        (["--group", "x", "--group-dir", ""], "--group-dir"),
        (["--group", "x", "--run", "1"], "--run"),
        (["--exit-status"], "--exit-status"),
        (["7", "--attempt", "1"], "--attempt"),
        (["7", "--clock-tolerance", "3s"], "--clock-tolerance"),
    ],
)
def test_explains_group_flags_out_of_place_are_one_line_naming_the_flag(
    argv: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from jobwarden.cli.main import main

    monkeypatch.setenv("JOBWARDEN_HOME", str(tmp_path))
    assert main(["explain", *argv]) == UsageError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("jobwarden: ") and named in err.splitlines()[0] and "Traceback" not in err


def test_a_rank_restarted_by_its_shim_is_judged_by_its_last_run() -> None:
    first = [record("started", 1.0, run=1), record("ended", 5.0, died_at=5.0, exit_code=1, signal=None)]
    second = [record("started", 7.0, run=2), record("ended", 9.0, died_at=9.0, exit_code=0, signal=None)]
    story = RankStory.of("rank-0", first + second)
    assert classify(story).cause.name == "SUCCEEDED"
    assert classify(RankStory.of("rank-0", second + first[:1])).cause.name == "RUNNING"

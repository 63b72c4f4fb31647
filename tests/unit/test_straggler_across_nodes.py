"""`straggler` across the nodes of a group (rules.speed.acrossnodes): each node's published rank views,
merged and judged by the single-node rule; read from the group directory as untrusted documents
(store.groupdir), shown by `explain --group` (control.views.group, text.group)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from jobwarden.clock import iso
from jobwarden.control.views.group import group_view
from jobwarden.rules.speed.acrossnodes import group_straggler, node_document, node_ranks
from jobwarden.rules.speed.evidence import Neighbour, RankView
from jobwarden.rules.speed.ranks import straggler
from jobwarden.store import groupdir
from jobwarden.text.group import clock_time, group_report

from .test_groupdir import rank_file
from .test_speed_ranks import rank, ranks

WALL = 1_700_000_000.0


def sleeper(n: int) -> RankView:
    """A rank that sleeps most of its step: the others wait for it in their all_reduce."""
    shares = (("idle", 0.6), ("computing", 0.35), ("collective", 0.05))
    return RankView(rank=n, pid=200 + n, looks=20, shares=shares, idle_detail="clock_nanosleep in step")


def node(name: str, *views: RankView, wall: float = WALL, near: tuple[Neighbour, ...] = ()) -> dict:
    """A node's document as its shim writes it, through JSON as a reader gets it."""
    return json.loads(json.dumps(node_document(name, wall, 20.0, views, near)))


def merged(*docs: dict) -> object:
    found = [node_ranks(d) for d in docs]
    assert all(f is not None for f in found)
    return group_straggler([f for f in found if f is not None])


def test_the_straggler_on_another_node_is_found_by_merging_the_nodes() -> None:
    fast, slow = rank(0, 0.6), sleeper(1)
    # each node alone has one rank: no comparison, no straggler
    assert straggler(ranks(fast)) is None and straggler(ranks(slow)) is None
    s = merged(node("n1", fast), node("n2", slow))
    assert s is not None
    assert (s.finding.rank, s.node, s.pid, s.nodes) == (1, "n2", 201, 2)  # type: ignore[attr-defined]
    assert s.finding.title == straggler(ranks(fast, slow)).title  # type: ignore[union-attr,attr-defined]
    assert "slept in 60% of the looks (clock_nanosleep in step)" in s.finding.summary  # type: ignore[attr-defined]


def test_the_why_comes_from_the_stragglers_own_node() -> None:
    """A CPU wait of its own, and the process that shared its CPUs as its node saw it (not another's)."""
    fast = rank(0, 0.6, wait_share=0.05)
    slow = rank(1, 0.05, wait_share=0.5)
    theirs = Neighbour(pid=7, user="carol", cpu=0.9, cmdline="other node's hog")
    ours = Neighbour(pid=9, user="bob", cpu=0.9, cmdline="stress --cpu 1")
    s = merged(node("n1", fast, near=(theirs,)), node("n2", slow, near=(ours,)))
    assert s is not None and s.node == "n2"  # type: ignore[attr-defined]
    why = s.finding.summary  # type: ignore[attr-defined]
    assert "waited for a CPU 50%" in why and "pid 9 (bob) used 0.90 CPUs: stress --cpu 1" in why
    assert "carol" not in why


def test_balanced_nodes_have_no_straggler() -> None:
    assert merged(node("n1", rank(0, 0.6)), node("n2", rank(1, 0.55))) is None


def test_a_node_that_stopped_publishing_long_ago_is_not_compared() -> None:
    old = node("n2", sleeper(1), wall=WALL - 300)
    assert merged(node("n1", rank(0, 0.6)), old) is None
    # the newer view of a rank wins where two nodes name it
    again = node("n3", rank(1, 0.6), wall=WALL + 1)
    assert merged(node("n1", rank(0, 0.6)), node("n2", sleeper(1)), again) is None


def test_a_document_that_is_not_what_a_shim_writes_is_refused() -> None:
    good = node("n2", sleeper(1))
    for bad in (
        {**good, "node": 3},
        {**good, "wall": "soon"},
        {**good, "window_s": -20.0},
        {**good, "ranks": {"0": 1}},
        {**good, "ranks": [{**good["ranks"][0], "rank": "1"}]},
        {**good, "ranks": [{**good["ranks"][0], "rank": -1}]},
        {**good, "ranks": [{**good["ranks"][0], "shares": [["idle", 5.0]]}]},
        {**good, "ranks": [{**good["ranks"][0], "shares": [["elsewhere", 0.5]]}]},
        {**good, "ranks": [{**good["ranks"][0], "halves": [0.1]}]},
        {**good, "ranks": [{**good["ranks"][0], "idle_detail": "x" * 10_000}]},
        {**good, "ranks": [{**good["ranks"][0], "looks": True}]},
        {**good, "neighbours": [{"pid": 1, "user": "x", "cpu": "all", "cmdline": ""}]},
        {**good, "ranks": [{**good["ranks"][0], "majflt_per_s": -1.0}]},
        {**good, "ranks": [{**good["ranks"][0], "majflt_per_s": "many"}]},
        {**good, "ranks": [{**good["ranks"][0], "majflt_per_s": float("inf")}]},
    ):
        assert node_ranks(bad) is None, bad
    assert node_ranks(good) is not None
    faulting = node("n2", replace(sleeper(1), majflt_per_s=420.0))
    assert node_ranks(faulting).ranks[0].majflt_per_s == 420.0  # type: ignore[union-attr]


def test_the_documents_are_cut_to_size() -> None:
    many = [replace(rank(n, 0.6), where_detail="f" * 5000) for n in range(100)]
    hogs = [Neighbour(pid=n, user="u", cpu=0.5, cmdline="c" * 500) for n in range(10)]
    doc = node_document("n1", WALL, 20.0, many, hogs)
    assert len(doc["ranks"]) == 64 and len(doc["neighbours"]) == 3
    assert len(json.dumps(doc)) < groupdir.MAX_RANK_VIEWS
    assert node_ranks(json.loads(json.dumps(doc))) is not None


def write_group(root: Path, docs: dict[str, dict]) -> None:
    attempt = groupdir.attempt_dir(root, 0)
    groupdir.write_document(
        attempt / "group.json", {"v": 1, "group": "g", "attempt": 0, "nodelist": "n[1-2]"}
    )
    for n, (name, doc) in enumerate(docs.items()):
        record = {"v": 1, "kind": "started", "group": "g", "attempt": 0, "rank": n, "node": name}
        groupdir.append_record(rank_file(attempt, n, name), {**record, "pid": 200 + n, "wall": WALL})
        groupdir.write_document(groupdir.rank_views_file(attempt, name), doc)


def test_explain_group_names_the_stragglers_rank_node_and_pid(tmp_path: Path) -> None:
    root = tmp_path / "groups" / "g"
    write_group(root, {"n1": node("n1", rank(0, 0.6)), "n2": node("n2", sleeper(1))})
    view = group_view(tmp_path, "g", None, str(root))
    out = view.to_json()["straggler"]
    assert (out["rank"], out["node"], out["pid"], out["rule"]) == (1, "n2", 201, "straggler")
    assert out["title"].startswith("Rank 1 is a straggler: about ") and out["nodes_compared"] == 2
    assert "slept in 60%" in out["summary"] and out["remedy"]
    text = list(group_report(view))
    line = next(t for t in text if "[straggler]" in t)
    assert line.startswith("  rank 1 on node n2 (pid 201) [straggler]: Rank 1 is a straggler: about ")
    assert "ranks of 2 nodes compared" in line


def test_a_planted_or_bad_rank_views_file_is_left_out_and_said(tmp_path: Path) -> None:
    root = tmp_path / "groups" / "g"
    write_group(root, {"n1": node("n1", rank(0, 0.6)), "n2": {**node("n2", sleeper(1)), "wall": "x"}})
    views = groupdir.attempt_dir(root, 0) / "rankviews"
    os.symlink("/etc/passwd", views / "n3.json")
    (views / "n4.json").write_bytes(b"{" * 10)
    view = group_view(tmp_path, "g", None, str(root))
    assert view.straggler is None and view.to_json()["straggler"] is None
    assert any("n2" in why and "not what a shim writes" in why for why in view.refused), view.refused
    assert any("n3.json" in why for why in view.refused), view.refused
    assert any("n4.json" in why for why in view.refused), view.refused


def test_a_nodes_shim_publishes_its_ranks_at_most_every_few_seconds(tmp_path: Path) -> None:
    from jobwarden.clock import FakeClock
    from jobwarden.joboptions import JobOptions
    from jobwarden.model import JobSpec
    from jobwarden.rules.speed.evidence import SpeedEvidence
    from jobwarden.shim.record.groupsink import RANK_VIEWS_EVERY_S, GroupSink
    from jobwarden.store import Store

    root = tmp_path / "groups"
    with Store(tmp_path / "home") as store:
        opts = JobOptions(group="g", group_dir=str(root), node="n2", rank=1)
        job_id, run = store.create_job(JobSpec(("python", "t.py"), "/", "t"), opts.to_json(), WALL)
        logged: list[str] = []
        sink = GroupSink(store, store.job(job_id), run, FakeClock(), logged.append)
        ev = SpeedEvidence(window_s=20.0, cpus=1.0, affinity_cpus=1, ranks=(sleeper(1),))
        path = groupdir.rank_views_file(groupdir.attempt_dir(root, 0), "n2")
        sink.rank_views(WALL, replace(ev, ranks=()))
        assert not path.exists()  # no ranks on this node: nothing to compare
        sink.rank_views(WALL, ev)
        sink.rank_views(WALL + RANK_VIEWS_EVERY_S / 2, ev)
        assert json.loads(path.read_text())["wall"] == WALL
        sink.rank_views(WALL + RANK_VIEWS_EVERY_S, ev)
        doc = json.loads(path.read_text())
        assert doc["wall"] == WALL + RANK_VIEWS_EVERY_S and doc["node"] == "n2"
        assert node_ranks(doc) == node_ranks(node("n2", sleeper(1), wall=WALL + RANK_VIEWS_EVERY_S))
        assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
        assert logged == []


def test_balanced_ranks_are_said_compared_with_no_straggler(tmp_path: Path) -> None:
    root = tmp_path / "groups" / "g"
    write_group(root, {"n1": node("n1", rank(0, 0.6)), "n2": node("n2", rank(1, 0.55), wall=WALL - 4)})
    view = group_view(tmp_path, "g", None, str(root))
    out = view.to_json()
    assert out["straggler"] is None
    compared = out["rank_views"]
    assert (compared["nodes_compared"], compared["ranks"], compared["judged"]) == (["n1", "n2"], 2, 2)
    assert (compared["from"], compared["to"]) == (iso(WALL - 24), iso(WALL))  # n2's window starts first
    assert (compared["stale_nodes"], compared["job_ended"]) == ([], None)
    text = list(group_report(view))
    assert any(t.startswith("  no straggler among 2 ranks on 2 nodes (as of ") for t in text), text


def test_ranks_looked_at_too_briefly_are_not_said_compared(tmp_path: Path) -> None:
    root = tmp_path / "groups" / "g"
    brief = replace(rank(1, 0.55), looks=3)  # a rank that has just started
    write_group(root, {"n1": node("n1", rank(0, 0.6)), "n2": node("n2", brief)})
    view = group_view(tmp_path, "g", None, str(root))
    assert view.to_json()["rank_views"]["judged"] == 1
    assert any("ranks not compared yet" in t for t in group_report(view))


def test_a_stale_node_is_named_with_the_end_of_its_last_window(tmp_path: Path) -> None:
    root = tmp_path / "groups" / "g"
    docs = {"n1": node("n1", rank(0, 0.6)), "n2": node("n2", rank(1, 0.6)), "n3": node("n3", sleeper(2))}
    docs["n3"] = node("n3", sleeper(2), wall=WALL - 300)
    write_group(root, docs)
    view = group_view(tmp_path, "g", None, str(root))
    out = view.to_json()
    assert out["straggler"] is None  # the old sleeper speaks of another time
    assert out["rank_views"]["stale_nodes"] == [{"node": "n3", "to": iso(WALL - 300)}]
    assert out["rank_views"]["nodes_compared"] == ["n1", "n2"]
    line = next(t for t in group_report(view) if "n3" in t and "left out" in t)
    assert "5m00s before the newest (it stopped publishing)" in line, line


def test_after_the_end_the_straggler_is_named_from_the_last_views_with_their_span(tmp_path: Path) -> None:
    """The job ended (both ranks stopped by the engine): the views are its last windows, and say so."""
    root = tmp_path / "groups" / "g"
    write_group(root, {"n1": node("n1", rank(0, 0.6)), "n2": node("n2", sleeper(1))})
    attempt = groupdir.attempt_dir(root, 0)
    for n, name in enumerate(("n1", "n2")):
        end = {"v": 1, "kind": "ended", "group": "g", "attempt": 0, "rank": n, "node": name, "pid": 200 + n}
        groupdir.append_record(
            rank_file(attempt, n, name),
            {
                **end,
                "wall": WALL + 60 + n,
                "died_at": WALL + 60 + n,
                "signal": "SIGTERM",
                "end_reason": "engine-stop",
            },
        )
    view = group_view(tmp_path, "g", None, str(root))
    out = view.to_json()
    assert (out["straggler"]["rank"], out["straggler"]["node"]) == (1, "n2")
    assert out["rank_views"]["job_ended"] == iso(WALL + 61)
    assert (out["rank_views"]["from"], out["rank_views"]["to"]) == (iso(WALL - 20), iso(WALL))
    line = next(t for t in group_report(view) if "[straggler]" in t)
    assert "(in the last views before the job ended at " in line, line
    assert f"{clock_time(WALL - 20)}–{clock_time(WALL)}, ranks of 2 nodes compared)" in line, line

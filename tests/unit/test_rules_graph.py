"""The hang signatures as edges of the wait-for graph (rules.hang.graph): each signature's rule is its
edges (read from the recorded reproducers' stacks) and a finding made from edges alone, so a signature's
input can be built as edges; its finding says the graph's chain, the kernel's lead-in steps included."""

from __future__ import annotations

import dataclasses

from jobwarden.observations import ProcessFacts, Wait
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.hang import collective, fork, graph, states, workers
from jobwarden.rules.hang.graph import Edge
from jobwarden.rules.lookup import describe
from tests.fixtures.stacks.pyspy import Recording, recording

from .test_rules_hang import ranked, ranks

WRAPPER = 99  # a `bash run.sh` around the job's Python: it waits for its child in wait4


def wrapped(ev: RunEvidence, child: int) -> RunEvidence:
    """The same run under a wrapper shell whose wait4 for `child` the kernel shows."""
    shell = ProcessFacts(WRAPPER, 1, "bash run.sh", "S", is_main=True)
    wait = Wait(WRAPPER, WRAPPER, "child", "wait4", f"child pid {child}", (child,))
    return dataclasses.replace(ev, pid=WRAPPER, processes=(shell, *ev.processes), waits=(wait, *ev.waits))


# --- the graph ------------------------------------------------------------------------------------


def test_a_kernel_wait_is_an_edge_and_the_lead_in_stops_at_the_target() -> None:
    waits = [
        Wait(1, 1, "child", "wait4", "child pid 2", (2,)),
        Wait(2, 2, "child", "wait4", "child pid 3", (3,)),
        Wait(3, 3, "pipe-read", "read", "pipe:[7]", (4,)),
    ]
    assert Edge.of(waits[0]) == Edge(1, 1, "child", "child pid 2", (2,), "live", "wait4")
    assert [s.to for s in graph.lead_in(1, waits, 3)] == [2, 3]
    assert graph.lead_in(1, waits, 1) == ()  # the main process is the waiter: nothing leads to it
    assert graph.lead_in(1, waits, 9) == ()  # the kernel's chain misses it


# --- pool-worker-lost: a result wait whose only feeder died -----------------------------------------


def test_pool_worker_lost_is_a_result_edge_whose_feeder_died() -> None:
    rec = recording("pool_sigkill")
    ev = rec.evidence()
    (dead,) = rec.deaths()
    parent = rec.pid("parent")
    api = "Pool.map (multiprocessing/pool.py:367)"
    assert workers.pool_edges(ev) == [Edge(parent, parent, "pool-result", api, (dead.pid,), "died")]
    built = workers.lost_from(ev, [Edge(parent, parent, "pool-result", api, (dead.pid,), "died")])
    assert built == explain(ev)[0]
    assert built.rule == "pool-worker-lost"
    assert built.evidence[-1] == (
        f"wait-for graph: {_named(rec, 'parent')} waits in {api} for a result of pid {dead.pid}; pid "
        f"{dead.pid} was killed by SIGKILL: the result never comes, everything waits for it"
    )
    alive = Edge(parent, parent, "pool-result", api, (dead.pid,), "live")
    assert workers.lost_from(ev, [alive]) is None  # a feeder that still runs is no signature


def test_pool_worker_lost_says_the_wrapper_that_waits_for_the_pools_parent() -> None:
    rec = recording("pool_sigkill")
    parent = rec.pid("parent")
    (dead,) = rec.deaths()
    (f,) = explain(wrapped(rec.evidence(), parent))
    assert f.rule == "pool-worker-lost" and f.pids == (dead.pid, parent)  # as found at once: one finding
    assert f.evidence[-1].startswith(
        f"wait-for graph: pid {WRAPPER} (bash run.sh) waits for its child pid {parent}, which waits in "
        f"Pool.map (multiprocessing/pool.py:367) for a result of pid {dead.pid}; pid {dead.pid} was killed"
    )


# --- fork-deadlock: a lock whose holder thread is absent from the child ------------------------------


def test_fork_deadlock_is_a_lock_edge_whose_holder_is_absent() -> None:
    rec = recording("fork_mp")
    ev = rec.evidence()
    child, parent = rec.pid("child"), rec.pid("parent")
    (edge,) = fork.fork_edges(ev)
    assert (edge.pid, edge.kind, edge.on, edge.far) == (child, "lock", (parent,), "absent")
    assert edge.thing.startswith("load_shard (")
    built = fork.from_edges(ev, [Edge(child, edge.tid, "lock", edge.thing, (parent,), "absent")])
    assert built == explain(ev)[0]
    assert built.rule == "fork-deadlock" and built.pids == (child,)
    assert built.evidence[-1] == (
        f"wait-for graph: {_named(rec, 'child')} waits for a lock at {edge.thing} held by a thread that "
        f"stayed in pid {parent} at the fork; that thread does not exist in pid {child}: nobody will ever "
        "release the lock"
    )
    held = dataclasses.replace(edge, far="live")  # a lock wait whose holder runs: no signature
    assert fork.from_edges(ev, [held]) is None


def test_fork_deadlock_says_the_parent_that_waits_for_the_stuck_child() -> None:
    rec = recording("fork_os")
    child, parent = rec.pid("child"), rec.pid("parent")
    wait = Wait(parent, parent, "child", "wait4", f"child pid {child}", (child,))
    (f,) = explain(dataclasses.replace(rec.evidence(), waits=(wait,)))
    assert f.rule == "fork-deadlock" and f.pids == (child,)
    assert f.evidence[-1].startswith(
        f"wait-for graph: {_named(rec, 'parent')} waits for its child pid {child}, which waits for a lock"
    )
    assert f"held by a thread that stayed in pid {parent} at the fork" in f.evidence[-1]


# --- collective-hang: ranks waiting for a peer that is not in the collective -------------------------


def test_collective_hang_is_ranks_waiting_for_a_peer_not_in_it() -> None:
    ev = ranks()
    (edge,) = collective.collective_edges(ev)
    assert edge == Edge(30093, 30093, "collective", "all_reduce", (30094,))
    built = collective.from_edges(ev, [Edge(30093, 30093, "collective", "all_reduce", (30094,))])
    assert built == explain(ev)[0]
    assert built.rule == "collective-hang" and built.pids == (30094, 30093)
    assert built.evidence[-1] == (
        "wait-for graph: pid 30093 (python collective_hang.py (rank 0)) waits in all_reduce for pid "
        "30094, which is not in it; pid 30094 is elsewhere, at run (/srv/collective_hang.py:12): "
        "everything waits for it"
    )
    both = collective.from_edges(ev, [Edge(30093, 30093, "collective", "all_reduce", (30094, 30095))])
    assert (
        both is not None
        and "waits in all_reduce for pids 30094, 30095, which are not in it" in both.evidence[-1]
    )
    # no edge to a peer: the ranks wait for one off this machine
    alone = collective.from_edges(ev, [Edge(30093, 30093, "collective", "all_reduce", ())])
    assert alone is not None and alone.title == "Hung in all_reduce" and alone.pids == (30093,)


def test_ranks_in_two_collectives_wait_for_each_other() -> None:
    edges = collective.collective_edges(ranked("all_reduce", "broadcast"))
    assert [(e.pid, e.thing, e.on) for e in edges] == [
        (30093, "all_reduce", (30094,)),
        (30094, "broadcast", (30093,)),
    ]
    (f,) = explain(ranked("all_reduce", "broadcast"))
    assert f.evidence[-1].endswith("rank 1 (pid 30094) waits in broadcast instead: everything waits for it")


# --- uninterruptible-io: a kernel wait with no process on its far side -------------------------------


def test_a_d_state_is_a_kernel_edge_with_nobody_on_its_far_side() -> None:
    facts = ProcessFacts(9000, 1, "python train.py", "D", ("D",), "rpc_wait_bit_killable", state_for_s=900.0)
    ev = RunEvidence("running", None, None, None, 9000, hang_window_s=600.0, processes=(facts,))
    edge = Edge(9000, 9000, "kernel", "rpc_wait_bit_killable", (), "none")
    assert states.d_state_edges(ev) == [edge]
    built = states.from_edges(ev, [edge])
    assert built == explain(ev)[0] and built.rule == "uninterruptible-io"
    assert not any(e.startswith("wait-for graph:") for e in built.evidence)  # nothing leads to it
    assert states.from_edges(ev, [dataclasses.replace(edge, far="live")]) is None
    (f,) = explain(wrapped(ev, 9000))
    assert f.pids == (9000,)
    assert f.evidence[-1] == (
        "wait-for graph: pid 99 (bash run.sh) waits for its child pid 9000, which waits in the kernel "
        "(rpc_wait_bit_killable) for no process; the kernel call has no process on its far side: an NFS "
        "server that does not answer (a hard mount retries forever)"
    )


def _named(rec: Recording, role: str) -> str:
    return describe(rec.pid(role), rec.process(role).cmdline, 40)

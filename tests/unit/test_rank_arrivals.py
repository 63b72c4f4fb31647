"""The straggler from when each rank called its collectives, as its recorder says (rules.speed.arrivals):
who the others wait for and how long, by the call times or by the device's durations; mismatched or
partial collectives left out — `straggler` deciding on them where the looks cannot, and not where a rank
did not answer; then the path of an answer: the hooks' thread answering a poll (never overwriting a hang's
answer), the probe reading it back without trusting it, and the rank watch polling real FIFOs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest

from jobwarden.observations import Arrival
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import flightrec
from jobwarden.rules.speed.arrivals import MIN_INTERVALS, waits
from jobwarden.rules.speed.evidence import RecorderWaits
from jobwarden.rules.speed.ranks import MIN_COVERED_S, straggler
from jobwarden.shim.watch import rankwatch
from jobwarden.shim.watch.rankwatch import RankWatch
from tests.support import eventually

from .test_flightrec import serving
from .test_rules import assert_well_formed
from .test_speed_ranks import rank, rank_member, ranks, syscall

MS = 1_000_000
T0 = 1_795_000_000 * 1_000_000_000  # a wall clock in ns, as torch's time_created_ns


def called(step_ms: float, late_ms: float = 0.0, n: int = 80, op: str = "all_reduce") -> list[Arrival]:
    """A rank's collectives, one a step: each called `late_ms` after the step began."""
    return [Arrival("0", s, op, T0 + int((s * step_ms + late_ms) * MS)) for s in range(1, n + 1)]


# --- who waits, from when each rank called ---------------------------------------------------------------


def test_the_rank_that_calls_late_is_the_one_waited_for() -> None:
    # steps of 40 ms; rank 1 calls 30 ms into each, ranks 0 and 2 at once: they wait 30 of every 40 ms
    found = waits({0: called(40), 1: called(40, late_ms=30), 2: called(40, late_ms=1)})
    assert set(found) == {0, 1, 2}
    assert found[0].share == pytest.approx(0.75) and found[2].share == pytest.approx(29 / 40)
    assert found[1].share == 0.0 and found[1].halves == (0.0, 0.0)
    assert found[0].halves == pytest.approx((0.75, 0.75))
    assert (found[1].last, found[1].compared, found[0].last) == (80, 80, 0)
    assert found[1].late_ms == pytest.approx(30.0) and found[0].late_ms == 0.0
    assert not found[0].timed


def test_by_the_devices_durations_where_torch_timed_them() -> None:
    """NCCL with timing: the ranks call alike (their CPUs run ahead), rank 1's GPU gets there 20 ms late:
    the others' collectives last 20 ms longer on theirs."""
    timed = {
        r: [a._replace(duration_ms=21.0 if r != 1 else 1.0) for a in called(40, late_ms=r * 0.1)]
        for r in (0, 1, 2)
    }
    found = waits(timed)
    assert all(w.timed for w in found.values())
    assert found[1].share == 0.0 and found[0].share == pytest.approx(0.5) and found[1].last == 80
    # one rank untimed: the call times decide, and they show nobody waiting long
    timed[2] = called(40, late_ms=0.2)
    assert not any(w.timed for w in waits(timed).values())


def test_only_collectives_every_rank_called_alike_are_compared() -> None:
    r0, r1 = called(40), called(40, late_ms=30)
    r1[10] = r1[10]._replace(op="broadcast")  # a mismatch: the hang rules' matter, not a step
    found = waits({0: [*r0, Arrival("0", 81, "all_reduce", T0 + 81 * 40 * MS)], 1: r1})
    assert found[0].compared == 79  # #11 differs, #81 only rank 0 has called yet
    # one rank with too few intervals: nothing at all (it may be the one the others wait for)
    assert waits({0: called(40), 1: called(40, n=MIN_INTERVALS)}) == {}
    assert waits({0: called(40)}) == {}
    # polls with a gap between them: only consecutive collectives make an interval
    gapped = [a for a in called(40) if not 15 <= a.seq <= 30]
    late = [a for a in called(40, late_ms=30) if not 15 <= a.seq <= 30]
    assert waits({0: gapped, 1: late})[0].share == pytest.approx(0.75)


def two_ranks(step_ms: float, late: Callable[[int, int], float], n: int = 256) -> dict[int, list[Arrival]]:
    """Two ranks computing `step_ms` a step; rank r starts late(r, s) ms late (descheduled, or more work)
    before it calls collective s, which ends when the later rank calls it: a poll's 256 collectives."""
    calls: dict[int, list[Arrival]] = {0: [], 1: []}
    ended = 0.0
    for s in range(1, n + 1):
        at = {r: ended + step_ms + late(r, s) for r in (0, 1)}
        for r in (0, 1):
            calls[r].append(Arrival("0", s, "all_reduce", T0 + int(at[r] * MS)))
        ended = max(at.values())
    return calls


def test_a_rank_descheduled_in_a_glimpse_is_no_straggler() -> None:
    """Seen in the project's CI: balanced ranks beside a CPU hog, steps of half a millisecond, so that a
    poll's 256 collectives span an eighth of a second. Rank 1, descheduled for 12 ms four times in that
    glimpse, made rank 0 wait 29 % of it, in both halves: "about 1.4×". Nothing over the window says why:
    no straggler. A why of its own (here its looks computing) names it; so do 2 s of collectives."""
    hogged = {40, 90, 150, 200}

    def descheduled(r: int, s: int) -> float:
        return 12.0 if r == 1 and s in hogged else 0.05 * ((s + r) % 2)  # and a little jitter

    found = waits(two_ranks(0.5, descheduled))
    assert found[0].share == pytest.approx(0.29, abs=0.01) and min(found[0].halves) > 0.25
    assert found[0].covered_s == pytest.approx(0.19, abs=0.01)
    blocked = (rank(0, 0.9, recorder=found[0]), rank(1, 0.9, recorder=found[1]))
    assert straggler(ranks(*blocked)) is None
    computing = (rank(0, 0.9, recorder=found[0]), rank(1, 0.7, recorder=found[1]))
    f = straggler(ranks(*computing))
    assert f is not None and f.rank == 1 and "Why: its main thread computed in 30%" in f.summary, f
    longer = waits(two_ranks(8.0, descheduled, n=400))  # 3.2 s of 8 ms steps: four deschedulings are 1.5 %
    assert longer[0].covered_s > MIN_COVERED_S and longer[0].share < 0.02
    steady = waits(two_ranks(8.0, lambda r, s: 4.0 if r == 1 else 0.0))  # 2 s: late at each one
    assert steady[0].covered_s > MIN_COVERED_S and steady[0].share == pytest.approx(1 / 3, abs=0.01)
    f = straggler(ranks(rank(0, 0.9, recorder=steady[0]), rank(1, 0.9, recorder=steady[1])))
    assert f is not None and f.rank == 1 and "about 1.5× slower" in f.title and "work of its own" in f.summary


# --- straggler, decided by the recorders -------------------------------------------------------------------


def recorded(share: float, last: int = 0) -> RecorderWaits:
    return RecorderWaits(share, (share, share), 30.0 if last else 0.0, last, 40, False, 12.0)


def test_the_recorders_name_a_rank_the_looks_cannot() -> None:
    """Every main thread blocked alike (futexes): the looks say nobody lags; the recorders say rank 1."""
    looks = ranks(rank(0, 0.85), rank(1, 0.85))
    assert straggler(looks) is None
    ev = ranks(rank(0, 0.85, recorder=recorded(0.75)), rank(1, 0.85, recorder=recorded(0.0, last=40)))
    f = straggler(ev)
    assert f is not None and f.rank == 1 and f.pids[0] == 201
    assert f.title == "Rank 1 is a straggler: about 4× slower per step than the others"
    assert "spends 0% there (their flight recorders)" in f.summary
    assert "Why: its main thread was blocked" in f.summary and "work of its own" in f.summary
    assert (
        "rank 1 (pid 201), its flight recorder (when it called its collectives): waited for a later rank "
        in (f.evidence[1])
    )
    assert "the one waited for in 40 of 40 collectives, 30.0 ms after the earliest" in f.evidence[1]
    assert "py-spy dump --native --pid 201" in f.remedy
    assert_well_formed([f])


def test_calls_that_do_not_block_are_no_measure_of_the_wait() -> None:
    """DDP's 25 buckets a step are asynchronous all_reduces: rank 1's backward 5 % slower calls each
    bucket a little later than the last, and the call times add that up to more than half of rank 0's
    time; its main thread, computing, was blocked in 5 % of the looks: no 2× straggler."""

    def buckets(rank_no: int, steps: int = 24) -> list[Arrival]:
        found = []
        for step in range(steps):
            for k in range(25):
                at = step * 105.0 + k * (4.2 if rank_no == 1 else 4.0)
                found.append(Arrival("0", 1 + step * 25 + k, "all_reduce", T0 + int(at * MS)))
        return found

    measured = waits({0: buckets(0), 1: buckets(1)})
    assert measured[0].share > 0.5 and measured[1].last == 600  # rank 1 is late, by the call times
    ev = ranks(rank(0, 0.05, recorder=measured[0]), rank(1, 0.05, recorder=measured[1]))
    assert straggler(ev) is None
    # blocked as long as the recorders say, it is one: the looks bound the wait, never make it
    blocked = ranks(rank(0, 0.9, recorder=measured[0]), rank(1, 0.9, recorder=measured[1]))
    f = straggler(blocked)
    assert f is not None and f.rank == 1 and "about 2.3× slower" in f.title, f


def test_the_looks_name_a_rank_slow_inside_its_collectives() -> None:
    """Measured beside a CPU hog: rank 1 in a 0.1-CPU cgroup calls its all_reduce late, and its own part
    of the exchange is throttled as well, so rank 0 waits after rank 1 called. The call times say 17 %;
    rank 0 was blocked in 95 % of the looks. Where the recorders name nobody, the looks do."""
    r0 = rank(0, 0.95, wait_share=0.44, recorder=RecorderWaits(0.17, (0.21, 0.12), 0.4, 178, 512, False, 3.5))
    quota = {"quota_cpus": 0.1, "throttled_share": 1.0, "wait_share": 0.91}
    r1 = rank(1, 0.3, **quota, recorder=RecorderWaits(0.02, (0.02, 0.02), 1.1, 334, 512, False, 3.5))
    f = straggler(ranks(r0, r1))
    assert f is not None and f.rank == 1 and "(their flight recorders)" not in f.summary
    assert "Why: its cpu cgroup's quota of 0.1 CPUs" in f.summary
    assert any("its flight recorder" in e for e in f.evidence)  # what they said is shown all the same


def test_where_the_looks_decide_a_blocked_rank_waits_on_nothing_of_its_own() -> None:
    """The recorders say rank 0 hardly waits; the looks find rank 1 less in its collectives, computing
    in 60 % of them, yet its main thread ran no longer than rank 0's. "Work of its own" is the recorders'
    why: the looks alone have none, and name nobody."""
    r0 = rank(0, 0.9, cpu_used=0.5, recorder=recorded(0.1))
    r1 = rank(1, 0.4, cpu_used=0.5, recorder=recorded(0.05, last=40))
    assert straggler(ranks(r0, r1)) is None
    f = straggler(ranks(r0, replace(r1, cpu_used=0.8)))  # it did run longer: it computes more
    assert f is not None and f.rank == 1 and "Why: its main thread computed in 60%" in f.summary


def test_the_looks_decide_where_a_rank_has_no_recorder() -> None:
    """A rank without the recorder's answer (no torch.distributed group of its own, or late): the looks
    at every rank decide, and here they say nobody lags."""
    ev = ranks(rank(0, 0.85, recorder=recorded(0.75)), rank(1, 0.85))
    assert straggler(ev) is None
    # the recorders agree with the looks: balanced ranks wait alike
    balanced = ranks(rank(0, 0.4, recorder=recorded(0.3)), rank(1, 0.4, recorder=recorded(0.32)))
    assert straggler(balanced) is None


def test_a_blip_in_the_recorders_is_no_straggler() -> None:
    """Rank 1 was late in the older half of the intervals only (a start-up, a checkpoint)."""
    blip = RecorderWaits(0.1, (0.0, 0.6), 10.0, 20, 40, False, 12.0)
    ev = ranks(rank(0, 0.8, recorder=recorded(0.6)), rank(1, 0.8, recorder=blip))
    assert straggler(ev) is None


# --- the answer's path: the hooks' thread, the probe, the rank watch ---------------------------------------


def torch_entries(rank_no: int, n: int = 80) -> dict[str, object]:
    """What torch's _dump_fr_trace gives, as far as the poll reads it."""
    entries: list[dict[str, object]] = [
        {
            "process_group": ("0", "default_pg"),
            "collective_seq_id": s,
            "p2p_seq_id": 0,
            "is_p2p": False,
            "profiling_name": "gloo:all_reduce",
            "time_created_ns": T0 + (s * 40 + (30 if rank_no == 1 else 0)) * MS,
            "duration_ms": None,
        }
        for s in range(1, n + 1)
    ]
    entries.append({**entries[0], "is_p2p": True, "collective_seq_id": 0, "profiling_name": "gloo:send"})
    return {"version": "2.10", "entries": entries}


def test_the_hooks_answer_a_poll_in_a_file_of_its_own() -> None:
    from jobwarden.hooks.site import _jobwarden_hooks as hooks

    text = hooks.arrivals_text(torch_entries(1), 7, 1, 0.0)
    d = json.loads(text)
    assert (d["pid"], d["rank"]) == (7, 1) and len(d["arrivals"]) == 80  # the send left out
    assert d["arrivals"][0] == ["0", 1, "gloo:all_reduce", T0 + 70 * MS, None]
    many = {"entries": [torch_entries(0)["entries"][0]] * 1000}  # type: ignore[index]
    assert len(json.loads(hooks.arrivals_text(many, 7, 0, 0.0))["arrivals"]) == hooks.POLL_ENTRIES


def write_answer(path: Path, body: object) -> Path:
    path.write_text(json.dumps(body))
    return path


def test_the_probe_trusts_nothing_in_an_answer(tmp_path: Path) -> None:
    good = {"pid": 7, "rank": 0, "at": 1.0, "arrivals": [["0", 3, "gloo:all_reduce", T0, 2.5]]}
    path = write_answer(tmp_path / f"7{flightrec.ARRIVALS}", good)
    assert flightrec.read_arrivals(path, 7) == (Arrival("0", 3, "all_reduce", T0, 2.5),)
    assert flightrec.read_arrivals(path, 8) is None  # another process's
    for bad in (
        ["0", 3, "all_reduce", T0],  # a field short
        ["0", -3, "all_reduce", T0, None],
        [0, 3, "all_reduce", T0, None],
        ["0", 3, "all_reduce", "then", None],
        ["0", 3, "all_reduce", T0, True],
        ["0", 3, "all_reduce", T0, -1.0],
    ):
        write_answer(path, {**good, "arrivals": [bad]})
        assert flightrec.read_arrivals(path, 7) is None, bad
    path.write_bytes(b"{" + b" " * flightrec.MAX_ARRIVALS_BYTES + b"}")
    assert flightrec.read_arrivals(path, 7) is None  # too large to be the hooks'
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    write_answer(tmp_path / "elsewhere.json", good)
    assert flightrec.read_arrivals(path, 7) is None  # a planted symlink is never followed


@pytest.fixture
def serving_ranks(tmp_path: Path) -> Iterator[Path]:
    """Pids 11 and 12 serving their recorders, their dumps made up (rank 1 calls 30 ms late): the py dir."""
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    with ExitStack() as stack:
        for pid, rank_no in ((11, 0), (12, 1)):
            entries = torch_entries(rank_no)
            stack.enter_context(serving(py_dir, pid, lambda stacks, e=entries: e))
        yield py_dir


def test_the_rank_watch_polls_each_ranks_recorder(tmp_path: Path, serving_ranks: Path) -> None:
    py_dir = serving_ranks
    root = tmp_path / "proc"
    for pid in (11, 12):
        syscall(root, pid, "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n")  # both blocked in a futex
    watch = RankWatch(ProcFS(root), machine="x86_64", dumps=False, py_dir=py_dir)
    watch.now_ns = lambda: T0 + 3300 * MS  # the made-up collectives are "now": none older than the window
    members = [rank_member(11, 0, "S"), rank_member(12, 1, "S")]
    watch.tick(0.0, members)  # asks both
    assert {p.name for p in py_dir.iterdir()} >= {"11.fr.req", "12.fr.req"}
    answers = [py_dir / f"{pid}{flightrec.ARRIVALS}" for pid in (11, 12)]
    eventually("both answers", lambda: all(p.exists() for p in answers), 30)
    watch.tick(0.5, members)  # reads both answers
    v0, v1 = watch.views({}, {}, 10.0)
    assert v0.recorder is not None and v1.recorder is not None
    assert v0.recorder.share == pytest.approx(0.75) and v1.recorder.last == 80
    assert not (py_dir / f"11{flightrec.DUMP}").exists()  # a poll never writes a hang's answer
    row = watch.rows()[1]["collective"]
    assert row == {"group": "0", "seq": 80, "op": "all_reduce", "at": 1_795_000_003.23, "rate": 25.0}
    f = straggler(ranks(*(replace(v, looks=20, shares=(("collective", 1.0),)) for v in (v0, v1))))
    assert f is not None and f.rank == 1


def test_a_users_large_recorder_is_not_polled(tmp_path: Path) -> None:
    """A dump costs 4-6 us an entry: with a user's 20,000 (a tenth of a second, the GIL held) every 10 s
    the poll would slow the job. Its polls go unanswered; a hang's request is still answered."""
    from jobwarden.hooks.site import _jobwarden_hooks as hooks

    assert hooks.recorder_entries({"TORCH_FR_BUFFER_SIZE": "20000"}) == 20000
    assert hooks.recorder_entries({"TORCH_NCCL_TRACE_BUFFER_SIZE": "256"}) == 256
    assert hooks.recorder_entries({"TORCH_FR_BUFFER_SIZE": "-5"}) == 0
    entries = torch_entries(0)
    with serving(tmp_path, 7, lambda stacks: entries, polls=False):
        assert flightrec.poll(tmp_path, 7)
        assert flightrec.request(tmp_path, [7])  # after the poll: answered after it was ignored
        eventually("the hang's answer", lambda: (tmp_path / f"7{flightrec.DUMP}").exists(), 30)
        assert not (tmp_path / f"7{flightrec.ARRIVALS}").exists()


def test_a_polls_answer_is_no_io_of_the_rank(tmp_path: Path) -> None:
    """The shim takes a rank's read() and write() bytes (/proc/PID/io's rchar and wchar) as a sign of
    progress: an answer of ~20 KB every 10 s written with write() made a hung job look busy. The hooks
    store it through a mapping: the answering thread's own counters barely move."""
    entries = torch_entries(1, n=256)
    answer = tmp_path / f"7{flightrec.ARRIVALS}"
    with serving(tmp_path, 7, lambda stacks: entries) as thread:

        def io_of_thread() -> int:
            text = Path(f"/proc/self/task/{thread.native_id}/io").read_text()
            fields = dict(line.split(": ") for line in text.splitlines())
            return int(fields["rchar"]) + int(fields["wchar"])

        before = io_of_thread()
        assert flightrec.poll(tmp_path, 7)
        eventually("the poll's answer", answer.exists, 30)
        arrivals = flightrec.read_arrivals(answer, 7)
        assert arrivals is not None and len(arrivals) == 255  # the last 256 entries, less the send
        assert answer.stat().st_size > 12_000 and oct(answer.stat().st_mode & 0o777) == "0o600"
        assert io_of_thread() - before < 64  # the request's byte read from the FIFO, nothing written


def test_the_devices_timings_decide_where_the_newest_have_none() -> None:
    """torch gives a collective its duration once it has ended: the newest, still running on the slow
    rank's GPU, have none. The ended ones are enough to say who the others wait for."""
    timed = {
        r: [a._replace(duration_ms=21.0 if r != 1 else 1.0) for a in called(40, late_ms=r * 0.1)]
        for r in (0, 1)
    }
    for r in (0, 1):
        timed[r][-2:] = [a._replace(duration_ms=None) for a in timed[r][-2:]]
    found = waits(timed)
    assert found[0].timed and found[1].share == 0.0 and found[0].share == pytest.approx(0.5)
    assert found[0].compared == 78


def test_answers_nested_deep_or_dated_ahead_are_refused(tmp_path: Path) -> None:
    path = tmp_path / f"7{flightrec.ARRIVALS}"
    path.write_text('{"pid": 7, "arrivals": ' + "[" * 50_000 + "]" * 50_000 + "}")  # under the size cap
    assert flightrec.read_arrivals(path, 7) is None  # json's RecursionError, not the shim's tick
    dump = tmp_path / f"7{flightrec.DUMP}"
    dump.write_text("[" * 50_000 + "]" * 50_000)
    assert flightrec.read_dump(dump) is None
    # a call time ahead of the clock would never leave the window, nor the `collective` column
    kept = rankwatch._Rank(rank_member(11, 0, "S"), 0)
    ahead = Arrival("0", 99, "all_reduce", T0 + 3600 * 1_000_000_000)
    kept.note_arrivals([*called(40), ahead], T0 + 2000 * MS)
    assert (99 not in {seq for _, seq in kept.arrivals}) and kept.last_call == called(40)[-1]

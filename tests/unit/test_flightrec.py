"""The flight recorder, end to end but the job: the hooks' side (the record they write, the thread they serve
it from), the probe that asks for it and reads it back without trusting it, and the comparison that names
the rank the others wait for, on dumps recorded from real torchrun jobs (tests/fixtures/flightrec)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobwarden.observations import (
    CollectiveCall,
    Frame,
    ProcessDeath,
    ProcessFacts,
    ProcessStack,
    RankRecorder,
    ThreadStack,
)
from jobwarden.probes import flightrec
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.hang import desync

from .test_rules import assert_well_formed, rules_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flightrec"
PIDS = {0: 41000, 1: 41001, 2: 41002}  # the recorded pids replaced: the evidence's processes use these


def recorded(scenario: str) -> list[RankRecorder]:
    found = []
    for path in sorted((FIXTURES / scenario).glob("rank*.fr.json")):
        recorder = flightrec.parse(json.loads(path.read_text()))
        assert recorder.rank is not None
        found.append(dataclasses.replace(recorder, pid=PIDS[recorder.rank]))
    return found


def hung(recorders: list[RankRecorder], **changes: object) -> RunEvidence:
    ranks = sorted(r.rank for r in recorders if r.rank is not None)
    processes = [ProcessFacts(40999, 1, "torchrun mlstack.py", "S", is_main=True)]
    processes += [ProcessFacts(PIDS[r], 40999, f"python mlstack.py (rank {r})", "S", rank=r) for r in ranks]
    ev = RunEvidence(
        state="running",
        exit_code=None,
        signal=None,
        end_reason=None,
        pid=40999,
        hang_window_s=10.0,
        processes=tuple(processes),
        recorders=tuple(recorders),
    )
    return dataclasses.replace(ev, **changes)  # type: ignore[arg-type]


# --- the comparison, on recorded dumps ----------------------------------------------------------------


def test_rank_that_calls_broadcast_where_the_other_calls_all_reduce() -> None:
    findings = explain(hung(recorded("rank-wrong-op")))
    assert rules_of(findings) == ["collective-hang"]
    (f,) = findings
    assert f.title == "Rank 1 called broadcast (mlstack.py:322) where rank 0 waits in all_reduce #6"
    assert f.rank == 1
    assert f.pids == (PIDS[1], PIDS[0])
    # two ranks, one on each side: the choice is said, with its reason
    assert "As many ranks are on each side" in f.summary
    assert "last common collective (#5) was all_reduce" in f.summary
    assert any(
        e.startswith(f"rank 1 (pid {PIDS[1]}): broadcast #6 on [4], called from rank_wrong_op (")
        for e in f.evidence
    )
    assert any(
        e.startswith(f"rank 0 (pid {PIDS[0]}): all_reduce #6 on [4]") and "waiting" in e for e in f.evidence
    )
    assert "the ranks agree up to all_reduce #5" in f.evidence
    assert f.remedy.startswith("Start with rank 1 at rank_wrong_op (")
    assert_well_formed(findings)


def test_rank_that_skipped_a_collective_is_the_one_missing() -> None:
    (f,) = explain(hung(recorded("rank-skips")))
    assert f.rank == 1
    assert f.pids[0] == PIDS[1]
    assert f.title.startswith("Rank 1 never called all_reduce #5, where rank 0 waits (mlstack.py:")
    assert f"rank 1 (pid {PIDS[1]}): no collective #5; its last is all_reduce #4" in " ".join(f.evidence)


def test_the_rank_in_a_barrier_among_ranks_in_all_reduce() -> None:
    (f,) = explain(hung(recorded("rank-barrier")))
    assert f.title == "Rank 2 called barrier (mlstack.py:347) where ranks 0 and 1 wait in all_reduce #6"
    assert f.rank == 2
    assert f.pids == (PIDS[2], PIDS[0], PIDS[1])
    assert "As many" not in f.summary  # two against one: no choice to explain


def test_the_missing_rank_line_says_where_its_stack_is() -> None:
    thread = ThreadStack(1, "MainThread", (Frame("wait_for_bound", "/srv/mlstack.py", 123),))
    ev = hung(recorded("rank-skips"), stacks=(ProcessStack(PIDS[1], "py-spy", (thread,)),))
    (f,) = explain(ev)
    assert any("now at wait_for_bound (/srv/mlstack.py:123)" in e for e in f.evidence)


def test_without_the_recorders_stacks_the_call_site_comes_from_the_ranks_own_stack() -> None:
    # the answer without stacks: torch's first symbolisation took longer than the judgement waited
    bare = [
        dataclasses.replace(r, calls=tuple(dataclasses.replace(c, frames=()) for c in r.calls))
        for r in recorded("rank-wrong-op")
    ]
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    thread = ThreadStack(1, "MainThread", (Frame("broadcast", c10d, 3145), Frame("run", "/srv/train.py", 41)))
    (f,) = explain(hung(bare, stacks=(ProcessStack(PIDS[1], "py-spy", (thread,)),)))
    assert f.title == "Rank 1 called broadcast (train.py:41) where rank 0 waits in all_reduce #6"


def call(
    seq: int, op: str = "all_reduce", sizes: tuple[int, ...] = (4,), done: bool = True
) -> CollectiveCall:
    return CollectiveCall("default_pg", seq, op, (sizes,), done)


def rank(r: int, *calls: CollectiveCall) -> RankRecorder:
    return RankRecorder(PIDS[r], r, 0.0, calls)


def test_a_shape_that_differs_is_named_with_both_shapes() -> None:
    ranks = [
        rank(0, call(1), call(2, sizes=(4,), done=False)),
        rank(1, call(1), call(2, sizes=(4,), done=False)),
        rank(2, call(1), call(2, sizes=(8,), done=False)),
    ]
    (f,) = explain(hung(ranks))
    assert f.title == "Rank 2 called all_reduce on [8] where ranks 0 and 1 wait in all_reduce #2 on [4]"


def test_ranks_that_agree_everywhere_leave_it_to_the_stacks() -> None:
    ranks = [rank(0, call(1), call(2, done=False)), rank(1, call(1), call(2, done=False))]
    assert desync.first_divergence(ranks) is None
    (f,) = explain(hung(ranks))
    assert f.title != "" and "called" not in f.title  # the stack fallback's words


def test_recorders_read_while_the_job_moved_on_are_no_divergence() -> None:
    # rank 1 read a moment after rank 0, one collective further: every call retired, nobody waits
    assert desync.first_divergence([rank(0, call(1), call(2)), rank(1, call(1), call(2), call(3))]) is None


def test_a_rank_whose_recorder_forgot_the_oldest_calls_is_compared_from_where_all_remember() -> None:
    ranks = [rank(0, call(3), call(4), call(5, done=False)), rank(1, *(call(n) for n in range(1, 5)))]
    found = desync.first_divergence(ranks)
    assert found is not None and found.seq == 5 and found.missing
    assert [r.rank for r in found.culprits] == [1]


def test_no_finding_from_recorders_before_the_watchdog_judged_a_hang() -> None:
    assert explain(hung(recorded("rank-wrong-op"), hang_window_s=None)) == []


# --- the probe: asking, waiting, reading without trusting -----------------------------------------------


def write_dump(py_dir: Path, pid: int, **changes: object) -> Path:
    d = json.loads((FIXTURES / "rank-barrier" / "rank0.fr.json").read_text())
    d.update(pid=pid, **changes)
    path = py_dir / f"{pid}{flightrec.DUMP}"
    path.write_text(json.dumps(d))
    return path


def test_a_dump_reads_back_with_its_calls(tmp_path: Path) -> None:
    read = flightrec.read_dump(write_dump(tmp_path, 7))
    assert read is not None
    recorder, stacks = read
    assert stacks and recorder.pid == 7 and recorder.rank == 0
    assert [c.op for c in recorder.calls] == ["all_reduce"] * 6
    assert recorder.calls[0].sizes == ((1,),) and recorder.calls[-1].sizes == ((4,),)
    assert not recorder.calls[-1].done and recorder.calls[-2].done


@pytest.mark.parametrize(
    "changes",
    [
        {"entries": "many"},
        {"rank": "0"},
        {"rank": True},
        {"entries": [{"group": ["0", "default_pg"], "seq": -1, "op": "gloo:all_reduce", "sizes": []}]},
        {"entries": [{"group": ["0", "default_pg"], "seq": True, "op": "gloo:all_reduce", "sizes": []}]},
        {"entries": [{"group": "default_pg", "seq": 1, "op": "gloo:all_reduce", "sizes": []}]},
        {"entries": [{"group": ["x"], "seq": 1, "op": 3, "sizes": []}]},
        {"entries": [{"group": ["x"], "seq": 1, "op": "all_reduce", "sizes": [[1.5]]}]},
        {"entries": [7]},
    ],
)
def test_a_dump_of_another_shape_is_left_out(tmp_path: Path, changes: dict[str, object]) -> None:
    assert flightrec.read_dump(write_dump(tmp_path, 7, **changes)) is None


def test_a_dump_that_names_another_pid_is_left_out(tmp_path: Path) -> None:
    path = write_dump(tmp_path, 7)
    path.rename(tmp_path / f"8{flightrec.DUMP}")
    assert flightrec.read_dump(tmp_path / f"8{flightrec.DUMP}") is None


def test_an_oversized_dump_or_a_symlink_is_not_read(tmp_path: Path) -> None:
    big = tmp_path / f"7{flightrec.DUMP}"
    big.write_bytes(b" " * (flightrec.MAX_DUMP_BYTES + 1))
    assert flightrec.read_dump(big) is None
    target = write_dump(tmp_path, 9)
    link = tmp_path / f"10{flightrec.DUMP}"
    link.symlink_to(target)
    assert flightrec.read_dump(link) is None


def test_point_to_point_entries_are_not_compared(tmp_path: Path) -> None:
    entry = {"group": ["0", "default_pg"], "seq": 0, "op": "gloo:send", "sizes": [[4]], "p2p": True}
    read = flightrec.read_dump(write_dump(tmp_path, 7, entries=[entry]))
    assert read is not None and read[0].calls == ()


def test_only_a_fifo_with_a_reader_is_asked(tmp_path: Path) -> None:
    (tmp_path / f"1{flightrec.REQUEST}").write_text("")  # a regular file: not a rank's FIFO
    os.mkfifo(tmp_path / f"2{flightrec.REQUEST}", 0o600)  # no reader: the rank is gone (ENXIO)
    os.mkfifo(tmp_path / f"3{flightrec.REQUEST}", 0o600)
    (tmp_path / f"4{flightrec.REQUEST}").symlink_to(tmp_path / f"3{flightrec.REQUEST}")
    reader = os.open(tmp_path / f"3{flightrec.REQUEST}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        asked = flightrec.request(tmp_path, [1, 2, 3, 4, 5])
        assert [a.pid for a in asked] == [3]
        assert os.read(reader, 64) == b"?"
    finally:
        os.close(reader)


def test_collect_waits_for_the_answer_with_stacks_until_its_deadline(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / f"7{flightrec.REQUEST}", 0o600)
    reader = os.open(tmp_path / f"7{flightrec.REQUEST}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        asked = flightrec.request(tmp_path, [7])
        write_dump(tmp_path, 7, stacks=False)  # the first answer: without the stacks
        clock = [0.0]

        def sleep(s: float) -> None:
            clock[0] += s

        found = flightrec.collect(asked, wait_s=0.5, monotonic=lambda: clock[0], sleep=sleep)
        assert [r.pid for r in found] == [7]
        assert clock[0] >= 0.5  # it waited for the stacks, up to the deadline and no longer
    finally:
        os.close(reader)


def test_collect_ignores_a_dump_left_from_an_earlier_request(tmp_path: Path) -> None:
    write_dump(tmp_path, 7)
    asked = [
        flightrec.Asked(
            7, tmp_path / f"7{flightrec.DUMP}", flightrec.version(tmp_path / f"7{flightrec.DUMP}")
        )
    ]
    assert flightrec.collect(asked, wait_s=0.0) == []


# --- the hooks' side: the record and its thread ----------------------------------------------------------


def test_the_hooks_serve_the_recorder_from_a_thread_that_sleeps_in_read(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "rank-wrong-op" / "rank0.fr.json").read_text())
    answered = threading.Event()
    torch_like = {"version": "2.10", "entries": [_as_torch(e) for e in raw["entries"]]}

    def dump(stacks: bool) -> dict[str, object]:
        if stacks:
            answered.set()
        return torch_like

    with serving(tmp_path, 7, dump):
        found = flightrec.collect(flightrec.request(tmp_path, [7]), wait_s=30)
        assert answered.wait(30)
        assert [len(r.calls) for r in found] == [6]
        assert found[0].calls[-1].frames[2].function == "rank_wrong_op"
    assert oct(os.stat(tmp_path / f"7{flightrec.DUMP}").st_mode & 0o777) == "0o600"


@contextmanager
def serving(
    py_dir: Path, pid: int, dump: Callable[[bool], object], polls: bool = True
) -> Iterator[threading.Thread]:
    """`pid` serving its recorder as the hooks do: a thread asleep in read() on its FIFO, answering with
    `dump`. The thread ends, and is joined, on leaving."""
    from jobwarden.hooks.site import _jobwarden_hooks as hooks

    job = hooks._Job(str(py_dir), 0, 0, None)
    fifo = py_dir / f"{pid}{flightrec.REQUEST}"
    os.mkfifo(fifo, 0o600)
    fd = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)
    job.recorder_fd, job.recorder_fd_id = fd, hooks.file_id(fd)
    thread = threading.Thread(target=hooks._recorder_loop, args=(job, pid, fd, dump, polls), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        job.recorder_fd_id = None  # no longer its own: the thread ends at its next wake
        os.write(fd, b"x")
        thread.join(30)
        os.close(fd)
    assert not thread.is_alive()


def _as_torch(e: dict[str, object]) -> dict[str, object]:
    """A hooks' entry back in torch's own names (what _dump_fr_trace returns)."""
    frames = [{"name": f["function"], "filename": f["file"], "line": f["line"]} for f in e["frames"]]  # type: ignore[attr-defined]
    return {
        "process_group": tuple(e["group"]),  # type: ignore[arg-type]
        "collective_seq_id": e["seq"],
        "p2p_seq_id": 0,
        "is_p2p": False,
        "profiling_name": e["op"],
        "input_sizes": e["sizes"],
        "input_dtypes": ["Float"],
        "retired": e["retired"],
        "state": "scheduled",
        "frames": frames,
    }


def test_the_record_stays_below_its_bound() -> None:
    from jobwarden.hooks.site import _jobwarden_hooks as hooks

    entry = {"profiling_name": "gloo:all_reduce", "collective_seq_id": 1, "input_sizes": [[1] * 16] * 32}
    frames = [{"name": "f" * 200, "filename": "/x" * 400, "line": 1}] * 100
    raw = {"entries": [{**entry, "frames": frames}] * 1000}
    text = hooks.recorder_text(raw, 1, 0, 0.0, True)
    assert len(text) <= hooks.RECORDER_MAX_BYTES
    assert json.loads(text)["entries"]


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"TORCH_FR_BUFFER_SIZE": "2000"}, True),
        (
            {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"},
            False,
        ),  # torch reads FR first
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}, True),
        ({"TORCH_FR_BUFFER_SIZE": "lots"}, False),
    ],
)
def test_the_recorder_is_served_only_where_it_records(environ: dict[str, str], on: bool) -> None:
    from jobwarden.hooks.site import _jobwarden_hooks as hooks

    assert hooks.recorder_on(environ) is on


def test_a_forked_child_forgets_its_parents_recorder(tmp_path: Path) -> None:
    from jobwarden.hooks.site import _jobwarden_hooks as hooks

    job = hooks._Job(str(tmp_path), 0, 0, None)
    fd = os.open(tmp_path, os.O_RDONLY)
    job.recorder_thread, job.recorder_fd, job.recorder_fd_id = 12345, fd, hooks.file_id(fd)
    hooks._forget_recorder(job)
    assert (job.recorder_thread, job.recorder_fd, job.recorder_fd_id) == (None, -1, None)
    with pytest.raises(OSError) as closed:
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF


def test_the_wrapped_init_process_group_keeps_its_signature_and_result() -> None:
    # Lightning and accelerate look for `device_id` in inspect.signature(dist.init_process_group)
    import inspect
    import types

    from jobwarden.hooks.site import _jobwarden_hooks as hooks

    def init_process_group(backend: str | None = None, *, device_id: object = None) -> str:
        """torch's own."""
        return f"joined {backend}"

    module = types.ModuleType("torch.distributed")
    module.init_process_group = init_process_group  # type: ignore[attr-defined]
    mesh = types.ModuleType("torch.distributed.device_mesh")  # binds it at import: init_device_mesh's
    mesh.init_process_group = init_process_group  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, mesh.__name__, mesh)
        hooks.hook_torch_distributed(module)
    wrapped = module.init_process_group  # type: ignore[attr-defined]
    assert wrapped is not init_process_group and mesh.init_process_group is wrapped  # type: ignore[attr-defined]
    assert "device_id" in inspect.signature(wrapped).parameters
    assert wrapped.__doc__ == "torch's own."
    assert wrapped("gloo") == "joined gloo"
    hooks.hook_torch_distributed(module)  # a second import hook leaves it wrapped once
    assert module.init_process_group is wrapped  # type: ignore[attr-defined]


def test_subgroups_that_share_a_description_are_compared_apart() -> None:
    # new_group() without group_desc: every subgroup is "undefined"; their names ("1", "2") tell them apart
    def sub(name: str, op: str) -> CollectiveCall:
        return CollectiveCall(name, 1, op, ((4,),), True, group_desc="undefined")

    ranks = [
        rank(0, sub("1", "all_reduce"), sub("2", "broadcast"), call(1, done=False)),
        rank(1, sub("1", "all_reduce"), sub("2", "broadcast"), call(1, done=False)),
    ]
    assert desync.first_divergence(ranks) is None


# --- gloo's size mismatch: no hang, an abort -----------------------------------------------------------


def test_a_rank_that_gloo_aborted_on_a_size_mismatch_is_named_with_it() -> None:
    # what torchrun printed (tests/fixtures/mlstack/rank-size-mismatch.log): gloo aborted rank 0, which
    # received 8 where it expected 4; torchrun then SIGTERMed rank 1 and raised ChildFailedError. The
    # explainer reads the last 400 lines of the output
    lines = (FIXTURES.parent / "mlstack" / "rank-size-mismatch.log").read_text().splitlines()
    deaths = (
        ProcessDeath(11911, 11887, "python mlstack.py rank-size-mismatch", 10.0, None, "SIGABRT", rank=0),
        ProcessDeath(11912, 11887, "python mlstack.py rank-size-mismatch", 10.1, None, "SIGTERM", rank=1),
        ProcessDeath(11887, 1, "torchrun mlstack.py rank-size-mismatch", 10.3, 1, None, is_main=True),
    )
    ev = RunEvidence("failed", 1, None, "exited", 11887, log_tail=tuple(lines), deaths=deaths)
    first = explain(ev)[0]
    assert first.rule == "native-crash" and first.rank == 0 and first.pids[0] == 11911
    assert first.title.endswith("crashed with SIGABRT: a collective size mismatch (gloo received 8 vs 4)")
    assert first.remedy.startswith("the ranks called a collective with tensors of different sizes")
    assert any(e.startswith("gloo (gloo-size-mismatch): ") for e in first.evidence)

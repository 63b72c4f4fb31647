"""periodic-stall names the function the job stalls in (rules.speed.stalls), from stack samples the shim
took during the stalls. The frames are those of real `py-spy dump --nonblocking` dumps of a loop that
calls `torch.save` in its own save_checkpoint (torch 2.13, Python 3.11): the named frame is the innermost
one of the job's own code. It names nothing when the samples disagree, show none of the job's code, are
too few, or belong to other stalls; and while the shim still dumps stalls it waits a stall or two for them."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from jobwarden.rules.speed import judge
from jobwarden.rules.speed.evidence import SpeedEvidence, StackSample, StepMove
from jobwarden.rules.speed.stalls import own_frame, stalls

from .test_speed_rules import HEALTHY, moves_with_stalls, one

SITE = "/venv/lib/python3.11/site-packages/"
PYLIB = "/usr/lib/python3.11/"
JOB = "/work/train.py"
SERIALIZATION = SITE + "torch/serialization.py"

# recorded: the main thread during torch.save(model, path) called from save_checkpoint (train.py:3)
SAVING = (
    (("_save", SERIALIZATION, 1312), ("save", SERIALIZATION, 1003)),
    (
        ("_open_zipfile_writer_file.__init__", SERIALIZATION, 828),
        ("_open_zipfile_writer", SERIALIZATION, 864),
        ("save", SERIALIZATION, 1002),
    ),
)
OUTER = (("save_checkpoint", JOB, 3), ("main", JOB, 8), ("<module>", JOB, 9))
# an evaluation pass of the job's own
EVALUATING = (
    ("_conv_forward", SITE + "torch/nn/modules/conv.py", 549),
    ("evaluate", JOB, 21),
    ("main", JOB, 10),
    ("<module>", JOB, 9),
)
# a job whose code is all installed (python -m a_package.train): nothing of its own to name
INSTALLED = (
    ("_save", SERIALIZATION, 1312),
    ("Trainer._save_checkpoint", SITE + "transformers/trainer.py", 3080),
    ("main", SITE + "a_package/train.py", 40),
    ("_run_code", PYLIB + "runpy.py", 88),
    ("<module>", "<frozen runpy>", 198),
)


def sample(at: float, stall_at: float | None, frames: tuple[tuple[str, str, int], ...]) -> StackSample:
    return StackSample(at, tuple((f, file) for f, file, _ in frames), tuple(n for *_, n in frames), stall_at)


MOVES = moves_with_stalls(500, 12.0)  # 7 stalls of 12 s every 500 steps


def stall_starts(moves: tuple[StepMove, ...] = MOVES) -> list[float]:
    found = stalls(moves)
    assert found is not None
    return [m.at for m, _ in found[1]]


Frames = tuple[tuple[str, str, int], ...]


def during(stacks: list[Frames], starts: list[float] | None = None) -> SpeedEvidence:
    """Evidence with one stall sample per stall (4 s into it), the i-th showing stacks[i]."""
    starts = stall_starts() if starts is None else starts
    taken = tuple(sample(at + 4.0, at, frames) for at, frames in zip(starts, stacks, strict=False))
    return replace(HEALTHY, moves=MOVES, stall_samples=taken, stall_sampling=True)


def test_the_stalls_function_is_named_with_its_line_and_how_many_samples_showed_it() -> None:
    saving = [SAVING[i % 2] + OUTER for i in range(5)]
    f = one(during([*saving, EVALUATING]), "periodic-stall")
    assert f.title.startswith("progress stops for 12s every 500 steps in save_checkpoint (train.py:3): ")
    assert f.title.endswith("% of the time"), f.title
    assert "in save_checkpoint (/work/train.py:3)" in f.summary
    assert (
        "the main thread was in save_checkpoint (/work/train.py:3) in 5 of 6 py-spy dumps taken during the "
        "stalls" in f.evidence
    )
    assert "save_checkpoint" in f.remedy and "jobwarden profile" not in f.remedy


def test_samples_that_disagree_name_nothing() -> None:
    mixed = [SAVING[0] + OUTER, EVALUATING, SAVING[1] + OUTER, EVALUATING]  # 2 and 2: no majority
    f = one(during(mixed), "periodic-stall")
    assert " in " not in f.title.split(":")[0], f.title
    assert any("4 py-spy dumps taken during the stalls name no function" in e for e in f.evidence)
    assert "jobwarden profile" in f.remedy
    # one sample is no agreement, even alone
    assert " in save_checkpoint" not in one(during([SAVING[0] + OUTER]), "periodic-stall").title


def test_samples_with_none_of_the_jobs_code_name_nothing() -> None:
    f = one(during([INSTALLED] * 5), "periodic-stall")
    assert f.title.startswith("progress stops for 12s every 500 steps: "), f.title
    # torch built from a source tree, jobwarden's own hooks: not the job's code either
    jobwarden_file = own_frame.__code__.co_filename  # .../jobwarden/rules/speed/stalls.py
    assert own_frame(StackSample(0, (("_save", "/src/pytorch/torch/serialization.py"), ("f", JOB)))) == (
        "f",
        JOB,
        0,
    )
    assert own_frame(StackSample(0, (("heartbeat", jobwarden_file), ("<frozen x>", "<frozen x>")))) is None


def test_samples_of_other_stalls_or_none_do_not_count() -> None:
    # taken when the counter stood still at moments that are no stall of these moves (a pause long ago,
    # a periodic sample): not about these stalls
    stray = [sample(float(i), float(i) + 0.25, SAVING[0] + OUTER) for i in range(5)]
    untagged = [sample(float(i), None, SAVING[0] + OUTER) for i in range(5)]
    ev = replace(HEALTHY, moves=MOVES, stall_samples=(*stray, *untagged), stall_sampling=False)
    f = one(ev, "periodic-stall")
    assert " in save_checkpoint" not in f.title and len(f.evidence) == 2


def test_while_stalls_are_dumped_the_finding_waits_a_stall_or_two_for_them() -> None:
    three = moves_with_stalls(500, 12.0, n=160)  # 3 stalls so far, none sampled yet
    assert len(stall_starts(three)) == 3
    waiting = replace(HEALTHY, moves=three, stall_sampling=True)
    assert [f.rule for f in judge(waiting)] == []
    # the shim cannot dump (no py-spy, not Python, ptrace refused): said at once, as before
    assert " in " not in one(replace(waiting, stall_sampling=False), "periodic-stall").title.split(":")[0]
    # two samples arrived: named at once
    starts = stall_starts(three)
    two = tuple(sample(at + 4.0, at, SAVING[0] + OUTER) for at in starts[1:])
    named = one(replace(waiting, stall_samples=two), "periodic-stall")
    assert "in save_checkpoint (train.py:3)" in named.title
    # dumps that never come do not hold it for ever: two stalls more and it is said without a function
    five = moves_with_stalls(500, 12.0, n=260)
    assert len(stall_starts(five)) == 5
    assert one(replace(waiting, moves=five), "periodic-stall").title.startswith("progress stops for 12s")


FILES = [JOB, SERIALIZATION, PYLIB + "x.py", "", "<frozen a>"]
frame = st.tuples(st.text(max_size=30), st.sampled_from(FILES))


@given(st.lists(st.tuples(st.sampled_from([*stall_starts(), 1.5]), st.lists(frame, max_size=8)), max_size=10))
def test_the_rule_takes_any_stall_samples(taken: list[tuple[float, list[tuple[str, str]]]]) -> None:
    # frames are py-spy's reading of the job's memory: outside input; never a crash, and a function is
    # named only when most samples of these stalls show it
    ev = replace(
        HEALTHY, moves=MOVES, stall_samples=tuple(StackSample(at + 4.0, tuple(f), (), at) for at, f in taken)
    )
    f = one(ev, "periodic-stall")
    matching = sum(1 for at, _ in taken if at != 1.5)
    named = [e for e in f.evidence if e.startswith("the main thread was in ")]
    if named:
        seen, of = (int(n) for n in named[0].rsplit(" py-spy dumps", 1)[0].rsplit(" in ", 1)[1].split(" of "))
        assert of == matching and seen >= 2 and 2 * seen > of

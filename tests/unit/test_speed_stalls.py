"""periodic-stall names the function the job stalls in (rules.speed.stalls), from stack samples the shim
took during the stalls. The frames are those of real `py-spy dump --nonblocking` dumps of a loop that
calls `torch.save` in its own save_checkpoint (torch 2.13, Python 3.11): the named frame is the innermost
one of the job's own code. It names nothing when the samples disagree, show none of the job's code, are
too few, or belong to other stalls; and while the shim still dumps stalls it waits a stall or two for them."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.rules.speed import judge
from jobwarden.rules.speed.evidence import SpeedEvidence, StackSample, StepMove
from jobwarden.rules.speed.stalls import own_frame, stalls
from jobwarden.shim.watch.stepsegments import Segments

from .test_speed_rules import HEALTHY, T0, moves_with_stalls, one

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


# --- short pauses, judged by the share of time they cost -------------------------------------------------

HEARTBEAT_S = 0.5  # jobwarden.heartbeat writes at most this often (the latest step, by the next call)


def looked_at(step_times: list[float], seconds: float, late_s: float = 0.0, seed: int = 0) -> Segments:
    """The counter of a job that makes its steps at `step_times`, reported through the heartbeat and looked
    at by the shim once a second, each look up to `late_s` late (a loaded machine): the moves it keeps."""
    written, last = [], float("-inf")
    for n, t in enumerate(step_times, 1):
        if t - last >= HEARTBEAT_S:
            written.append((t, n))
            last = t
    rng, seen = random.Random(seed), Segments()
    at, i, step = 0.3, 0, None
    while at < seconds:
        while i < len(written) and written[i][0] <= at:
            step, i = written[i][1], i + 1
        seen.observe(at, T0 + at, step)
        at += 1.0 + rng.uniform(0.0, late_s)
    return seen


def checkpointing(pause_s: float, every: int, seconds: float, step_s: float = 0.1) -> list[float]:
    """Steps of `step_s`, and after each `every` of them a pause of `pause_s`."""
    times, at = [], 0.0
    while at < seconds:
        for _ in range(every):
            at += step_s
            times.append(at)
        at += pause_s
    return times


def jittered(step_s: float, seconds: float, seed: int, spread: float = 0.3) -> list[float]:
    rng, times, at = random.Random(seed), [], 0.0
    while at < seconds:
        at += step_s * rng.uniform(1 - spread, 1 + spread)
        times.append(at)
    return times


def first_judged(seen_at: Callable[[float], Segments], rule: str, until: float) -> float | None:
    """The first moment (judged every 4 s, as the shim does) at which the moves seen so far make `rule`."""
    t = 4.0
    while t <= until:
        if rule in {f.rule for f in judge(replace(HEALTHY, moves=tuple(seen_at(t).moves)))}:
            return t
        t += 4.0
    return None


def test_a_short_checkpoint_that_costs_most_of_the_time_is_a_periodic_stall_within_45s() -> None:
    # 1.5 s of checkpoint after every 10 steps of 0.1 s: 60 % of the time lost, each pause half a long stall
    steps = checkpointing(1.5, 10, 120.0)
    for seed, late in ((0, 0.0), (1, 0.2), (2, 0.3), (3, 0.3)):
        f = one(replace(HEALTHY, moves=tuple(looked_at(steps, 120.0, late, seed).moves)), "periodic-stall")
        assert f.title.startswith("progress stops for ") and f.severity == "warning", f.title
        assert 25 <= int(f.title.rsplit(": ", 1)[1].split("%")[0]) <= 75, f.title  # looks see at least 25
        assert 5 <= int(f.title.split(" every ")[1].split()[0]) <= 20, f.title
        # slow from its first pause (at 1 s): said within 45 s of it, looked at as the shim looks
        took = first_judged(lambda t, s=seed, la=late: looked_at(steps, t, la, s), "periodic-stall", 60.0)
        assert took is not None and took - 1.0 <= 45.0, took
        print(
            f"periodic-stall, 1.5 s pauses, looks up to {late}s late: judged {took - 1.0:.0f}s after the 1st"
        )
    # the same loop without its pauses: nothing
    assert judge(replace(HEALTHY, moves=tuple(looked_at(checkpointing(0.0, 10, 120.0), 120.0).moves))) == []


@pytest.mark.parametrize("seed", range(6))
def test_jitter_late_looks_and_slow_steps_are_no_pause(seed: int) -> None:
    cases = {
        "10 steps/s, each ±30 %, looks up to 1 s late": (jittered(0.1, 120.0, seed), 1.0),
        "one step every 1.5 s: most looks find it still": (jittered(1.5, 120.0, seed, 0.2), 0.3),
        "a step every 0.3 s, looks up to 0.5 s late": (jittered(0.3, 120.0, seed), 0.5),
        "a step every 5 s": (jittered(5.0, 300.0, seed, 0.25), 0.3),
    }
    for why, (steps, late) in cases.items():
        moves = tuple(looked_at(steps, steps[-1], late, seed).moves)
        assert judge(replace(HEALTHY, moves=moves)) == [], why


def test_pauses_at_random_or_too_rare_to_cost_much_are_no_stall() -> None:
    rng = random.Random(7)
    times, at = [], 0.0
    while at < 120.0:  # a pause of 1-2 s now and then at random: waits on something outside the loop
        at += 0.1
        times.append(at)
        if rng.random() < 0.02:
            at += rng.uniform(1.0, 2.0)
    assert judge(replace(HEALTHY, moves=tuple(looked_at(times, 120.0).moves))) == []
    # a 1.5 s pause every 200 steps (20 s): 7 % of the time, regular but cheap
    rare = tuple(looked_at(checkpointing(1.5, 200, 120.0), 120.0).moves)
    assert judge(replace(HEALTHY, moves=rare)) == []

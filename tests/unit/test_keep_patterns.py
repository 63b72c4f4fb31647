"""--keep-running's patterns: refused at `run` when repeats nest, and bounded in the shim whatever they are
(issue 25, harm 7)."""

from __future__ import annotations

import pytest

from jobwarden.control.options import habit_options
from jobwarden.errors import UsageError
from jobwarden.shim.run.keeping import choose

BAIT = "python -c server " + "a" * 34 + "!"  # 2**34 ways for (a|a)+$ to fail on it


@pytest.mark.parametrize("pattern", ["(a+)+$", "(a*)*b", r"(\w+\s?)*$", r"(?:x|(\w+))+$", "(.*a)+!"])
def test_a_repeat_inside_a_repeat_is_refused_naming_the_option(pattern: str) -> None:
    with pytest.raises(UsageError, match=r"^--keep-running .*: a repeat inside a repeat"):
        habit_options(None, [pattern], None, None)


@pytest.mark.parametrize("pattern", ["tensorboard", "a+b+", r"(\d{1,3}\.)+", "(a++)+$", "(?>a+)+$", "[a+]+"])
def test_patterns_that_cannot_nest_their_backtracking_are_taken(pattern: str) -> None:
    assert habit_options(None, [pattern], None, None)["keep_running"] == [pattern]


def test_a_search_that_backtracks_for_ever_is_cut_and_its_pattern_keeps_nothing() -> None:
    cmdlines = {10: BAIT, 11: "tensorboard --logdir runs", 12: "aaa"}
    chosen = choose(["(a|a)+$", "tensorboard"], cmdlines, cpu_s=0.05)
    assert chosen.too_slow == ["(a|a)+$"]
    assert chosen.pids == {11}  # the next pattern is still searched


def test_fast_patterns_choose_every_match() -> None:
    cmdlines = {10: "tensorboard --logdir runs", 11: "python train.py", 12: "mlflow ui"}
    assert choose(["tensorboard", "^mlflow"], cmdlines) == ({10, 12}, [])

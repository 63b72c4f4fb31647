"""Property tests of the progress parsers (jobwarden.progress), which read whatever a job prints: no input
crashes them, the newest frame wins however the log is cut into reads, and a frame cut by the start of a
read never yields a wrong step."""

from __future__ import annotations

import itertools

from hypothesis import assume, given
from hypothesis import strategies as st

from jobwarden.progress import formats
from jobwarden.progress.frames import by_rank, frames
from jobwarden.progress.hints import from_command
from jobwarden.progress.model import Progress, Reading, run_counter
from jobwarden.progress.output import OutputProgress
from jobwarden.progress.stepclock import StepClock

steps = st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=30)
labels = st.sampled_from(["", "Epoch 3", "train", "rank 1", "a: b", "x" * 60])
junk = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)


def tqdm_frame(n: int, total: int | None, label: str, postfix: str = "") -> str:
    desc = f"{label}: " if label else ""
    if total is None:
        return f"{desc}{n}it [00:01, 5.40it/s{postfix}]"
    pct = min(100, n * 100 // max(total, 1))
    return f"{desc}{pct:3d}%|█▌        | {n}/{total} [00:01<00:02, 5.40it/s{postfix}]"


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def fed(chunks: list[str], follows: bool = True) -> tuple[Reading, int | None] | None:
    out = OutputProgress()
    for i, chunk in enumerate(chunks):
        out.feed(chunk, follows or i > 0)
    return out.main()


@given(junk, st.lists(st.integers(min_value=0, max_value=400), max_size=6), st.booleans())
def test_no_input_crashes_the_output_parser(text: str, cuts: list[int], follows: bool) -> None:
    found = fed(pieces(text, cuts), follows)
    if found is not None:
        reading, rank = found
        assert reading.step is None or reading.step >= 0
        assert rank is None or rank >= 0


@given(junk)
def test_no_frame_crashes_a_format(text: str) -> None:
    for parse in (*formats.BAR_PARSERS, *formats.LINE_PARSERS, formats.parse_hf_dict):
        parse(text)
    by_rank(text)
    frames(text)


@given(
    steps, st.none() | st.integers(min_value=1, max_value=10**7), labels, st.lists(st.integers(), max_size=8)
)
def test_the_newest_frame_wins_however_the_log_is_read(
    ns: list[int], total: int | None, label: str, cuts: list[int]
) -> None:
    text = "".join("\r" + tqdm_frame(n, total, label) for n in ns)
    found = fed(pieces(text, cuts))
    assert found is not None
    assert found[0].step == ns[-1]
    assert found[0].total == total


@given(
    steps,
    st.integers(min_value=1, max_value=10**7),
    st.integers(min_value=0),
    st.lists(st.integers(), max_size=5),
)
def test_a_frame_cut_by_the_start_of_a_read_never_yields_a_wrong_step(
    ns: list[int], total: int, start: int, cuts: list[int]
) -> None:
    text = "".join("\r" + tqdm_frame(n, total, "Epoch 1") for n in ns)
    start %= len(text)
    assume(start > 0)
    # a read that skips ahead begins one byte early (OutputTail): a frame that begins right there is whole
    found = fed(pieces(text[start - 1 :], cuts), follows=False)
    last = text.rindex("\r")
    if start - 1 <= last:  # the newest frame is whole in what was read
        assert found is not None and found[0].step == ns[-1]
    else:  # only the end of the newest frame: nothing, rather than a number cut from it
        assert found is None


@given(steps, st.integers(min_value=0), st.lists(st.integers(), max_size=5))
def test_a_cut_read_of_log_lines_never_yields_a_wrong_step(
    ns: list[int], start: int, cuts: list[int]
) -> None:
    lines = [f" [2026-01-01 00:00:00] iteration {n:8d}/{10**8:8d} | lm loss: 1.0E+00 |\n" for n in ns]
    text = "".join(lines)
    start %= len(text)
    found = fed(pieces(text[max(start - 1, 0) :], cuts), follows=start == 0)
    if found is not None:
        assert found[0].step in ns
    whole_last = start <= len(text) - len(lines[-1])
    if whole_last:
        assert found is not None and found[0].step == ns[-1]


@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=999)), min_size=1
    ),
    st.lists(st.integers(), max_size=8),
)
def test_torchrun_ranks_each_keep_their_own_newest_frame(
    frames_by_rank: list[tuple[int, int]], cuts: list[int]
) -> None:
    """Each rank's lines, interleaved, prefixed, and a line of one rank split by another's (as torchrun's
    tee copies a line not yet complete): every rank ends on its own last frame; rank 0's is shown."""
    text = ""
    pending: tuple[int, str] | None = None  # the rest of a rank's line, copied after another rank's
    for i, (rank, n) in enumerate(frames_by_rank):
        line = tqdm_frame(n, 1000, f"rank {rank}")
        if pending is not None and pending[0] == rank:  # a rank finishes its line before its next one
            text += pending[1]
            pending = None
        if i % 3 == 1 and pending is None:
            text += f"[default{rank}]:{line[:10]}"
            pending = (rank, f"[default{rank}]:{line[10:]}\n")
            continue
        text += f"[default{rank}]:{line}\n"
        if pending is not None:
            text += pending[1]
            pending = None
    text += pending[1] if pending else ""
    out = OutputProgress()
    for chunk in pieces(text, cuts):
        out.feed(chunk, True)
    last: dict[int, int] = {}
    for rank, n in frames_by_rank:
        last[rank] = n
    for rank, n in last.items():
        assert out.ranks[rank].bars[0].reading.step == n
    found = out.main()
    assert found is not None and found[1] == min(last)


@given(st.lists(st.tuples(st.floats(min_value=0.001, max_value=100), st.integers(0, 50)), min_size=1))
def test_the_step_clock_never_gives_a_negative_or_infinite_rate(moves: list[tuple[float, int]]) -> None:
    clock = StepClock()
    now, step = 0.0, 0
    for dt, dn in moves:
        now += dt
        step += dn
        clock.observe(now, step)
        rate = clock.rate(now)
        assert rate is None or 0 < rate < float("inf")


# the pieces of a loop's own prints and of boosting's eval lines, shuffled: the new parsers' paths
tokens = st.sampled_from(
    ["Epoch", "epoch", "step", "iter", "Step", " ", "/", " / ", "|", ",", ":", "=", "-", "[", "]", "\t",
     "'s ", "loss", "valid-logloss", "0.1", "1e-4", "nan", "3", "10", "0", "99999999999999999999", "of the"]
)  # fmt: skip


@given(st.lists(tokens, max_size=24))
def test_no_home_made_print_crashes_or_counts_past_its_total(parts: list[str]) -> None:
    line = "".join(parts)
    for parse in (formats.parse_plain, formats.parse_boosting):
        got = parse(line)
        if got is not None:
            assert got.step is None or got.total is None or 0 <= got.step <= got.total
            assert got.epoch is None or got.epochs is None or 0 <= got.epoch <= got.epochs
    found = fed([line + "\n"])
    done = run_counter(found[0]) if found is not None else None
    assert done is None or 0 <= done[0] <= done[1]


@given(st.lists(st.text(max_size=20), max_size=12))
def test_no_command_line_crashes_the_hints(argv: list[str]) -> None:
    hints = from_command(argv)
    assert all(n is None or 0 < n <= 10**9 for n in hints)


@given(
    st.integers(0, 10**6), st.integers(1, 10**6), st.floats(-5, 50), st.integers(1, 1000) | st.none(),
    st.booleans(), st.booleans(), st.floats(0.001, 1e4) | st.none(),
)  # fmt: skip
def test_the_runs_fraction_and_eta_stay_in_bounds(
    step: int, total: int, epoch: float, epochs: int | None, per_epoch: bool, closed: bool, rate: float | None
) -> None:
    p = Progress(step, total, rate, "it", epoch, (), "output", "tqdm", 0.0, closed=closed, epochs=epochs,
                 per_epoch=per_epoch)  # fmt: skip
    assert p.fraction is None or 0.0 <= p.fraction <= 1.0
    assert p.eta_s is None or p.eta_s >= 0
    got = p.to_json()
    assert got["epoch"] is None or got["epoch"]["n"] >= 1

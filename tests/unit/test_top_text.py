"""`top`'s text helpers: an explanation's lines wrapped with a hanging indent, a process's role."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from jobwarden.model import ProcessSnapshot, Ranks
from jobwarden.tui.cells import process_role
from jobwarden.tui.screens import hanging

WORD = st.text(st.sampled_from("abcxyz<>[]`'é:;"), min_size=1, max_size=15)


@given(st.integers(0, 6), st.lists(WORD, min_size=1, max_size=40), st.integers(20, 120))
@example(6, [":" * 15], 20)  # the first word cut: textwrap dropped the lead with it
def test_a_long_line_wraps_under_its_text_and_loses_no_word(lead: int, words: list[str], width: int) -> None:
    line = " " * lead + " ".join(words)
    pieces = hanging(line, width)
    assert "".join("".join(pieces).split()) == "".join(words)  # every character, in order
    if all(len(w) <= width - lead - 4 for w in words):  # none needs cutting: every word whole
        assert " ".join(" ".join(pieces).split()) == " ".join(words)
    assert all(len(p) <= width for p in pieces)
    assert pieces[0].startswith(" " * lead)
    for piece in pieces[1:]:
        assert piece.startswith(" " * (lead + 4)) and piece.strip()


def test_a_line_that_fits_is_left_alone() -> None:
    assert hanging("  what to do:  two  spaces", 80) == ["  what to do:  two  spaces"]


def _process(pid: int, ppid: int, rank: int | None) -> ProcessSnapshot:
    return ProcessSnapshot(
        pid, ppid, 0, "S", "python", 1, 0.0, ranks=Ranks(rank) if rank is not None else None
    )


def test_roles_main_rank_and_worker() -> None:
    procs = [_process(10, 1, None), _process(11, 10, 0), _process(12, 11, 0), _process(13, 10, None)]
    ranks = {p.pid: (p.ranks.rank if p.ranks else None) for p in procs}
    assert [process_role(p, 10, ranks) for p in procs] == ["main", "rank", "worker", "worker"]


def test_the_detail_progress_line_fits_the_pane() -> None:
    # A 100-column pane wrapped "(tqdm, read in-process, 0s ago)" onto a line of its own (issue 28)
    import time

    from jobwarden.progress.model import Progress
    from jobwarden.tui.cells import _progress_text
    from jobwarden.tui.data import Detail

    progress = Progress(
        117, 128, 3.33, "it", 3.0, {}, "output", "tqdm", time.time(), "train", "in-process", None
    )
    detail = Detail(None, [], [], [], None, None, step_rate=(3.3, 3.3))  # type: ignore[arg-type]
    for width in (80, 100):
        first, *_ = _progress_text(detail, progress, True, width).plain.split("\n")
        assert len(first) <= width - 1 and first.startswith("  progress ") and "117/128" in first
    wide, *_ = _progress_text(detail, progress, True, 200).plain.split("\n")
    assert wide.endswith("ago)")  # nothing cut where the pane has room

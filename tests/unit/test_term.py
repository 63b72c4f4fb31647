"""Tables fit the terminal; colour only for a terminal, never with NO_COLOR."""

from __future__ import annotations

import io

import pytest

from jobwarden.text import term


def test_the_last_column_is_cut_to_fit_the_width() -> None:
    rows = [("ID", "STATE", "COMMAND"), ("1", "running", "python train.py " + "--flag " * 30)]
    lines = ["  ".join(cells).rstrip() for cells in term.table(rows, width=60)]
    assert all(len(line) <= 60 for line in lines)
    assert lines[1].startswith("1   running  python train.py") and lines[1].endswith("…")


def test_a_narrow_terminal_still_shows_some_of_the_last_column() -> None:
    rows = [("A" * 50, "python train.py --lr 3 --epochs 10")]
    (cells,) = term.table(rows, width=40)
    assert len(cells[-1]) == term.MIN_LAST_COLUMN


def test_a_short_row_is_left_as_it_is() -> None:
    assert term.table([("1", "x")], width=80) == [["1", "x"]]


def test_columns_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "123")
    assert term.terminal_width() == 123


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("sys.stdout", _Tty())
    assert term.colour_wanted()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not term.colour_wanted()
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert not term.colour_wanted()

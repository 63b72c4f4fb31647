"""What the terminal allows: its width, and whether to colour. Every table of the CLI fits the width and
colours only a terminal whose user has not set NO_COLOR (https://no-color.org)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence

MIN_LAST_COLUMN = 20  # a table's last column (a command) is cut to fit, but never below this


def terminal_width() -> int:
    """What shutil.get_terminal_size() answers: $COLUMNS, else the terminal on stdout, else 80. Not
    shutil itself: it imports the compression modules, ~10 ms of every command."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def colour_wanted() -> bool:
    return not os.environ.get("NO_COLOR") and sys.stdout.isatty()


def for_terminal(lines: Iterable[str]) -> Iterator[str]:
    """Report lines as the CLI prints them: each once more through the sanitiser, whatever a formatter
    forgot to make one line, with our own colours (SGR) kept only where colour is wanted at all."""
    from jobwarden.text.sanitize import terminal_text  # its patterns: not on the path of `run`

    colours = colour_wanted()
    ours = re.compile(r"\x1b\[[0-9;]*m")  # SGR, as render._color writes it
    for line in lines:
        if colours and ours.sub("", line).isprintable():
            yield line  # nothing but colours (ours: every job field was cleaned): `ps --all` of 10,000 rows
        else:
            yield terminal_text(line, colours=colours)


def table(
    rows: Sequence[tuple[str, ...]],
    width: int | None = None,
    min_last: int = MIN_LAST_COLUMN,
    shrink: Mapping[int, int] | None = None,
) -> list[list[str]]:
    """Cells padded to their column's width; the last column cut so that a row fits `width` (the
    terminal's by default; 0: never cut). When the last column at `min_last` still leaves a row too wide
    (it would wrap), the columns of `shrink` (index -> the narrowest it may get) give way too, the widest
    first, their cells cut at a word. Returned as cells, so that a caller can colour one after padding."""
    width = terminal_width() if width is None else width
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    if width <= 0:
        return [[*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]] for row in rows]
    if shrink:
        widths = _shrunk(widths, width - min_last - 2 * len(widths), shrink)
        rows = [
            tuple(_cut_words(c, widths[i]) if i in shrink else c for i, c in enumerate(row)) for row in rows
        ]
    room = max(min_last, width - sum(widths) - 2 * len(widths))
    return [[*(c.ljust(w) for c, w in zip(row, widths, strict=False)), _cut(row[-1], room)] for row in rows]


def _shrunk(widths: list[int], budget: int, shrink: Mapping[int, int]) -> list[int]:
    """`widths` with the shrinkable columns narrowed, the widest first, until they sum to `budget` or
    every one is at its narrowest."""
    widths = list(widths)
    while sum(widths) > budget:
        slack = {i: widths[i] - least for i, least in shrink.items() if i < len(widths) and widths[i] > least}
        if not slack:
            break
        widest = max(slack, key=lambda i: widths[i])
        widths[widest] -= min(slack[widest], sum(widths) - budget)
    return widths


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 1] + "…"


def _cut_words(text: str, room: int) -> str:
    """`text` in `room` characters: whole words and an ellipsis where it can ('45% 450/1000 …'), else cut."""
    if len(text) <= room:
        return text
    words = text[: room - 1].rpartition(" ")[0].rstrip()
    return f"{words} …" if words and len(words) + 2 <= room else _cut(text, room)

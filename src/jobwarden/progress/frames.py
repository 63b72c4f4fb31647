"""The job's output as progress frames: per torchrun rank, one frame per carriage return or line.

A progress bar redraws its line with `\\r` and writes `\\n` only when it closes (tqdm's status_printer), so
a line-oriented reader sees nothing until the end: frames are split on `\\r` as well as `\\n`. A nested
tqdm bar at position k is drawn after k newlines and followed by k cursor-ups (`ESC[A`, tqdm's moveto):
those trailing moves give its position, 0 being the outer bar.

torchrun's `--tee`/`--redirects` copy each rank's output line by line with a `[{role}{local_rank}]:` prefix
(`[default0]:`, `[rank1]:`), and a line copied before it was complete gets the prefix again where the rest
begins, mid-line (research/slowness.md §3.7). Every prefix starts a piece of its rank's stream, which runs
to the end of that line: the pieces of one rank joined again give its frames whole, whatever the other
ranks wrote in between.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

RANK_PREFIX = re.compile(r"\[(?:[A-Za-z_]{1,32})?(\d{1,6})\]:")
# CSI (colours, cursor moves, erase), OSC/DCS/APC strings, other escapes, and C0 controls but tab
ANSI = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]P^_X][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])"
    r"|\x9b[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f]"
)
_CURSOR_UPS = re.compile(r"(?:\x1b\[(\d*)A)+[ \t]*$")
_UP = re.compile(r"\x1b\[(\d*)A")
_DELIMITER = re.compile(r"(\r\n|\r|\n)")
MAX_FRAME = 4096  # longer than any bar; a longer "frame" (a binary blob, a huge line) is cut to its end


class Frame(NamedTuple):
    """One frame of one rank's stream, escapes still in it (`clean()` strips them)."""

    raw: str
    rank: int | None  # None: not under a torchrun prefix
    position: int  # 0: an outer bar or any line; k: a bar nested k lines below
    ended: bool  # a line end followed it: the bar closed, or a log line is complete
    complete: bool  # a delimiter followed it (the newest frame of a stream may still be written)

    def clean(self) -> str:
        return ANSI.sub("", self.raw).strip()


def by_rank(text: str, rank: int | None = None) -> tuple[dict[int | None, str], int | None]:
    """The text of each rank's stream, prefixes removed, what no prefix covers under None; and whose
    line the text ends in. `rank`: whose line the text begins in (the previous read ended in it)."""
    if "]:" not in text and (rank is None or "\n" not in text):  # nearly always: no torchrun prefix at all
        return {rank: text}, rank
    streams: dict[int | None, list[str]] = {}
    start = 0
    for match in RANK_PREFIX.finditer(text):
        rank = _add(streams, rank, text[start : match.start()])
        rank, start = int(match.group(1)), match.end()
    rank = _add(streams, rank, text[start:])
    return {key: "".join(parts) for key, parts in streams.items()}, rank


def _add(streams: dict[int | None, list[str]], rank: int | None, piece: str) -> int | None:
    """A prefixed piece runs to the end of its line; what follows that line is nobody's until a prefix.
    Returns whose line the piece ends in."""
    if not piece:
        return rank
    if rank is not None:
        end = piece.find("\n")
        if end < 0:
            streams.setdefault(rank, []).append(piece)
            return rank
        streams.setdefault(rank, []).append(piece[: end + 1])
        piece = piece[end + 1 :]
    if piece:
        streams.setdefault(None, []).append(piece)
    return None


def frames(stream: str, rank: int | None = None) -> list[Frame]:
    """The frames of one stream, oldest first; the last is incomplete when no delimiter ends it."""
    parts = _DELIMITER.split(stream)
    texts, delimiters = parts[0::2], parts[1::2]
    out = []
    for i, raw in enumerate(texts):
        delimiter = delimiters[i] if i < len(delimiters) else ""
        if not raw and not delimiter:
            continue
        raw = raw[-MAX_FRAME:]
        out.append(Frame(raw, rank, position(raw), delimiter in ("\n", "\r\n"), bool(delimiter)))
    return out


def newest_first(stream: str, rank: int | None = None) -> Iterator[Frame]:
    """frames(), newest first, with `ended` true only where the line end closed a bar: a newline that
    only moved down to draw a nested bar (the next frame climbs back up) does not count."""
    found = frames(stream, rank)
    for i in range(len(found) - 1, -1, -1):
        frame = found[i]
        if frame.ended and i + 1 < len(found) and found[i + 1].position > 0:
            frame = frame._replace(ended=False)
        yield frame


def position(raw: str) -> int:
    """How many lines below the outer bar this frame was drawn: its trailing cursor-ups."""
    if not raw.endswith(("A", " ")) or "\x1b[" not in raw[-64:]:
        return 0
    tail = _CURSOR_UPS.search(raw[-64:])
    if tail is None:
        return 0
    return sum(int(n or 1) for n in _UP.findall(tail.group(0)))


def unfinished_tail(stream: str) -> str:
    """What follows the stream's last delimiter: a frame still being written (kept for the next read)."""
    cut = max(stream.rfind("\r"), stream.rfind("\n"))
    return stream[cut + 1 :]


def after_first_delimiter(stream: str) -> str:
    """The stream without its first, possibly cut, frame (a read that began mid-frame)."""
    cut = _DELIMITER.search(stream)
    return stream[cut.end() :] if cut else ""

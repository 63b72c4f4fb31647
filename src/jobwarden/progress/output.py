"""Progress from the job's output: the newest frame of each bar, kept across reads of the log.

The shim reads only the newest part of output.log at each tick (a job may print 100,000 frames a second;
only the last ones matter) and feeds it here with whether it follows the previous read directly. Frames
are taken newest first; per rank and bar position the first that parses wins and the older ones are not
even parsed. A read that does not follow the previous one may begin mid-frame: each stream's first frame
is then dropped, never parsed (a cut "…| 450/1000" read as "50/1000" would be a wrong step).

Which bar is *the* progress: the lowest rank's (rank 0 first; ranks' bars are never summed), and of its
bars the outer one (position 0), since an inner bar is a sub-task (a validation pass, an epoch's batches).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from jobwarden.progress import formats
from jobwarden.progress.epochs import around, epochs_as_steps, one_based, with_epoch
from jobwarden.progress.frames import Frame, after_first_delimiter, by_rank, newest_first, unfinished_tail
from jobwarden.progress.model import Metrics, Reading

MAX_CARRY = 4096  # an unfinished frame kept for the next read; longer is no frame of ours
# what may be a torchrun prefix whose end the next read brings: "[defau", "[rank1]"
_PARTIAL_PREFIX = re.compile(r"(?<!\x1b)\[[A-Za-z_]{0,32}\d{0,6}\]?$")  # not a CSI: "\x1b[A"


class Seen(NamedTuple):
    reading: Reading
    order: int  # when it was seen, in frames across feeds: the newer wins


class RankState:
    """What one rank's stream has shown: its bars by position, the last Trainer dict, Keras' epoch."""

    def __init__(self) -> None:
        self.bars: dict[int, Seen] = {}
        # position -> (bar, total, first step, the order of its first frame)
        self.firsts: dict[int, tuple[object, int | None, int, int]] = {}
        self.hf: Seen | None = None  # HF Trainer's metrics and epoch
        self.epoch_line: Reading | None = None  # the newest line that gave an epoch alone ("Epoch 3/10")
        self.carry = ""  # the unfinished frame at the end of the last read
        self.cut = False  # a read began inside a frame that has not ended yet: skip to its end


class OutputProgress:
    """Feed it the newest text of the log; ask `main()` for the progress it shows."""

    def __init__(self) -> None:
        self.ranks: dict[int | None, RankState] = {}
        self.feeds = 0
        self.moves = 0  # bumped whenever any bar of any rank shows a new step: the job advanced
        self.frames = 0  # frames scanned so far: the order of what was seen
        self._held = ""  # the start of a rank prefix cut by the end of the last read
        self.zero_epoch = False  # a plain line or a bar's description counted an epoch 0: they are 0-based
        self._line_of: int | None = None  # the rank whose line the last read ended in

    def feed(self, text: str, follows: bool) -> None:
        """`text`: the log's newest bytes, decoded. `follows`: it starts where the previous feed ended
        (or at the log's start); otherwise its first frame of each stream may be cut and is dropped."""
        self.feeds += 1
        text = (self._held if follows else "") + text
        held = _PARTIAL_PREFIX.search(text, max(0, len(text) - 48))
        self._held = text[held.start() :] if held else ""
        line_of = self._line_of if follows else None
        streams, self._line_of = by_rank(text[: held.start()] if held else text, line_of)
        if not follows:
            for state in self.ranks.values():
                state.carry, state.cut = "", True
        for rank, stream in streams.items():
            state = self.ranks.setdefault(rank, RankState())
            state.cut = state.cut or not follows
            whole = state.carry + stream
            if state.cut:  # its first frame may be the end of a cut one: never parsed
                state.cut = not _has_delimiter(whole)  # no end yet: the next read goes on skipping
                whole = after_first_delimiter(whole)
            self._scan(rank, state, whole)
            tail = unfinished_tail(whole)
            state.carry = tail if len(tail) <= MAX_CARRY else ""
            state.cut = state.cut or len(tail) > MAX_CARRY

    def _scan(self, rank: int | None, state: RankState, stream: str) -> None:
        found: dict[int, tuple[Reading, int]] = {}
        hf: Reading | None = None
        epoch: Reading | None = None
        ordered = list(newest_first(stream, rank))
        base, self.frames = self.frames, self.frames + len(ordered)
        dated = False  # a bar or line found with its own epoch: older epoch lines need no parsing
        for i, frame in enumerate(ordered):
            # a bar known already: only a Trainer dict or a Keras epoch line may still tell something
            if frame.position in found and not (
                frame.complete and _maybe_context(frame.raw, hf is None, epoch is None and not dated)
            ):
                continue
            text = frame.clean()
            if not text:
                continue
            if frame.position not in found:
                reading = formats.parse_bar(text)
                if reading is None and frame.complete and frame.ended:
                    reading = formats.parse_line(text)
                if reading is not None and reading.step is None and reading.format == "plain":
                    epoch = epoch or reading  # "Epoch 3/10" alone: the epoch of what runs beside it
                    continue
                if reading is not None:
                    found[frame.position] = reading._replace(closed=frame.ended), self.frames - i
                    self.zero_epoch = self.zero_epoch or reading.epoch == 0
                    dated = dated or reading.epoch is not None  # it has its epoch: no line needed
                    continue
            if frame.complete and hf is None and text.startswith("{'"):
                hf = formats.parse_hf_dict(text)
            elif frame.complete and epoch is None and "poch" in text[:80]:
                epoch = formats.parse_plain(text)
                epoch = epoch if epoch is not None and epoch.epoch is not None else None
        for position, (reading, order) in found.items():
            if _bar_shape(reading) != state.firsts.get(position, (None, None))[:2]:  # a new bar here
                first, zero, oldest = _first_of(ordered, position, reading)
                self.zero_epoch = self.zero_epoch or zero
                state.firsts[position] = (*_bar_shape(reading), first, base + oldest)
            self._keep(state, position, _line_closed(reading), order)
        if hf is not None:
            state.hf = Seen(hf, self.frames)
        if epoch is not None:
            state.epoch_line = epoch
            self.zero_epoch = self.zero_epoch or epoch.epoch == 0

    def _keep(self, state: RankState, position: int, reading: Reading, order: int) -> None:
        before = state.bars.get(position)
        if before is None or before.reading.step != reading.step or before.reading.label != reading.label:
            self.moves += 1
        state.bars[position] = Seen(reading, order)

    def main(self) -> tuple[Reading, int | None] | None:
        """The progress the output shows, and the rank it is of; None when it shows none."""
        for rank in sorted(self.ranks, key=_rank_order):
            state = self.ranks[rank]
            reading = self._of_rank(state)
            if reading is not None:
                return reading, rank
        return None

    def steps_by_rank(self) -> dict[int, int]:
        """Each rank's own step counter, where its lines carry a `[rankN]:` prefix (torchrun --tee)."""
        found = {}
        for rank, state in self.ranks.items():
            reading = self._of_rank(state) if rank is not None else None
            if rank is not None and reading is not None and reading.step is not None:
                found[rank] = reading.step
        return found

    def _of_rank(self, state: RankState) -> Reading | None:
        hf = state.hf.reading if state.hf else None
        line = state.epoch_line
        if not state.bars:
            if line is not None:
                return epochs_as_steps(line, self.zero_epoch)
            return hf  # Trainer's dicts alone (disable_tqdm): an epoch and a loss, no step
        positions = sorted(state.bars)
        outer = one_based(state.bars[positions[0]].reading, self.zero_epoch)
        inner = state.bars[positions[1]] if len(positions) > 1 else None
        # an inner bar last drawn before the outer one began is a leftover of an earlier loop
        began = state.firsts.get(positions[0], (None, None, 0, 0))[3]
        if hf is None and inner is not None and inner.order > began:
            outer = around(outer, inner.reading)
        metrics: Metrics = outer.metrics
        epoch = outer.epoch
        fmt = outer.format
        if hf is not None and outer.format == "tqdm":  # the bar is the Trainer's: its dicts say the rest
            metrics = _merge(hf.metrics, metrics)
            epoch = epoch if epoch is not None else hf.epoch
            fmt = "hf"
        reading = outer._replace(metrics=metrics, epoch=epoch, format=fmt)
        if line is not None and reading.epoch is None and fmt in ("keras", "tqdm", "rich"):
            # Keras' "Epoch 3/10" above its bar, or a loop's own epoch line around a bar of batches
            return with_epoch(reading, line, self.zero_epoch and fmt != "keras")
        if line is not None and reading.epochs is None and reading.per_epoch:
            reading = reading._replace(epochs=line.epochs)
        return reading

    def first_step(self, rank: int | None, label: str | None, total: int | None) -> int | None:
        """The first step the log showed of a bar (where a resumed run began), if it showed that bar."""
        state = self.ranks.get(rank)
        shape = _bar_shape(Reading(step=None, total=total, label=label))
        for bar, bar_total, first, _ in state.firsts.values() if state else ():
            if (bar, bar_total) == shape:
                return first
        return None

    def metrics(self) -> Metrics:
        """The newest Trainer dict's metrics (of the lowest rank that printed one): for a bar seen
        in-process, whose own frames carry none."""
        for rank in sorted(self.ranks, key=_rank_order):
            hf = self.ranks[rank].hf
            if hf is not None:
                return hf.reading.metrics
        return ()


def _bar_shape(reading: Reading) -> tuple[object, int | None]:
    """A bar's identity across frames: its label without numbers ("Epoch 3" is the bar of every epoch),
    its total."""
    label = None if reading.label is None else "".join("#" if c.isdigit() else c for c in reading.label)
    return label, reading.total


def _first_of(newest_first: list[Frame], position: int, newest: Reading) -> tuple[int, bool, int]:
    """The oldest frame of the read showing the same bar as `newest`: where it began (or where it was
    when first seen), and whether it described epoch 0 (Lightning's "Epoch 0": its labels count from 0).
    Parsed only when a bar appears, oldest first, up to the first match. Also its index, oldest first."""
    shape = _bar_shape(newest)
    for index, frame in enumerate(reversed(newest_first)):
        if frame.position != position:
            continue
        text = frame.clean()
        reading = formats.parse_bar(text) or (formats.parse_line(text) if frame.ended else None)
        if reading is not None and reading.step is not None and _bar_shape(reading) == shape:
            first = min(reading.step, newest.step if newest.step is not None else reading.step)
            return first, reading.epoch == 0, index
    return (newest.step if newest.step is not None else 0), False, len(newest_first)


def _has_delimiter(text: str) -> bool:
    return "\r" in text or "\n" in text


def _maybe_context(raw: str, want_hf: bool, want_epoch: bool) -> bool:
    """Could this frame be a Trainer dict or a Keras epoch line (cheap: no escapes stripped)?"""
    return (want_hf and "{'" in raw.lstrip()[:16]) or (want_epoch and "poch" in raw[:80])


def _line_closed(reading: Reading) -> Reading:
    """A log line (Megatron, DeepSpeed...) always ends with a newline: that closes no bar."""
    if reading.format in ("tqdm", "keras", "rich"):
        return reading
    return reading._replace(closed=False)


def _merge(first: Metrics, then: Metrics) -> Metrics:
    out = dict(first)
    out.update(then)
    return tuple(out.items())


def _rank_order(rank: int | None) -> float:
    """Rank 0 first, then what no prefix covers, then the other ranks."""
    return 0.5 if rank is None else float(rank)

"""The other sources of progress, as readings, and the choice between all of them.

- `jobwarden.heartbeat(step=, total=, **metrics)`: what the job says itself; it wins when it gives a step.
- The hooks' in-process bars (`<pid>.progress`: tqdm and Keras objects read exactly, no parsing): the
  lowest rank's process, its outer bar (ranks are never summed).
- The output (progress.output): everything else, also when there are no Python hooks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from jobwarden.progress.epochs import around, one_based
from jobwarden.progress.formats import KEY_VALUES, label_epochs, metrics_of
from jobwarden.progress.model import (
    MAX_COUNT,
    MAX_LABEL,
    Bar,
    HookProgress,
    Metrics,
    Reading,
    finite_metrics,
    merge_metrics,
)

_HEARTBEAT_FIELDS = ("step", "total", "epoch", "unit")


class Candidate(NamedTuple):
    """One source's reading, with where it came from."""

    reading: Reading
    source: str  # "heartbeat" | "output"
    observed: str  # "heartbeat" | "in-process" | "log"
    rank: int | None
    key: tuple[Any, ...]  # which bar: the rate is measured per bar, and starts over on another


def heartbeat_reading(info: Mapping[str, Any]) -> Reading | None:
    """What a heartbeat's info says of progress: `step`, `total`, `epoch`, `unit` and any other number as a
    metric; None when it says none of that (a bare heartbeat is a sign of life, not progress)."""
    step = _whole(info.get("step"))
    total = _whole(info.get("total"))
    epoch = _real(info.get("epoch"))
    unit = info.get("unit") if isinstance(info.get("unit"), str) else None
    metrics = finite_metrics((k, v) for k, v in info.items() if k not in _HEARTBEAT_FIELDS)
    if step is None and epoch is None and not metrics:
        return None
    return Reading(
        step=step,
        total=total if total is not None and total > 0 else None,
        unit=unit[:20] if unit else None,  # shown as "it/s", as tqdm's default
        epoch=epoch,
        metrics=metrics,
        format="heartbeat",
    )


def _whole(value: object) -> int | None:
    number = _real(value)
    return None if number is None or not 0 <= number <= MAX_COUNT else int(number)


def _real(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def bar_reading(bar: Bar) -> Reading:
    """An in-process bar as a reading: the counters exact, the metrics from tqdm's postfix or Keras'
    averages, the epoch from a description like Lightning's "Epoch 3"."""
    label = bar.desc.strip().rstrip(":").strip()[:MAX_LABEL] or None if bar.desc else None
    metrics = bar.metrics or metrics_of(KEY_VALUES, bar.postfix or "", skip=("v_num",))
    return Reading(
        step=bar.n,
        total=bar.total if bar.total and bar.total > 0 else None,
        unit=bar.unit,
        **label_epochs(label, rich=bar.kind == "rich"),
        metrics=metrics,
        format=bar.kind,
        label=label,
        closed=bar.closed,
    )


def in_process(records: Sequence[HookProgress], zero: bool = False) -> Candidate | None:
    """The bar the hooks saw that stands for the job: the lowest rank's process (then the oldest pid),
    its outer open bar (an epoch bar: with the bar of batches inside it), else the bar it closed last.
    `zero`: the job's epoch labels count from 0 (progress.epochs)."""
    with_bars = [r for r in records if r.bars]
    if not with_bars:
        return None
    chosen = min(with_bars, key=lambda r: (r.rank is None, r.rank or 0, r.pid))
    open_bars = sorted((b for b in chosen.bars if not b.closed), key=lambda b: b.position)
    if not open_bars:
        reading = one_based(bar_reading(chosen.bars[-1]), zero)
    else:
        reading = one_based(bar_reading(open_bars[0]), zero)
        inner = _inner(chosen.bars, open_bars[0])
        if inner is not None:
            reading = around(reading, bar_reading(inner))
    if reading.format == "keras" and chosen.epoch is not None:
        reading = reading._replace(epoch=float(chosen.epoch), per_epoch=True)
    return Candidate(reading, "output", "in-process", chosen.rank, _bar_key(reading, chosen.rank))


def _inner(bars: Sequence[Bar], outer: Bar) -> Bar | None:
    """The bar nested right inside `outer`: open, else the one closed last (a `leave=False` bar of
    batches between two epochs)."""
    below = [b for b in bars if b.position > outer.position and b.kind == outer.kind]
    live = [b for b in below if not b.closed]
    if live:
        return min(live, key=lambda b: b.position)
    return below[-1] if below else None


def in_process_activity(records: Sequence[HookProgress]) -> tuple[tuple[int, str, int, int], ...]:
    """Every bar's counter, of every process: any of them moving is the job moving."""
    return tuple((r.pid, b.kind, b.position, b.n) for r in records for b in r.bars)


def _shape(label: str | None) -> str | None:
    """A label without its numbers: "Epoch 3" and "Epoch 4" are one bar reset for the next epoch."""
    return None if label is None else "".join("#" if c.isdigit() else c for c in label)


def _newest_of_same_bar(hooks: Candidate, output: Candidate | None) -> Candidate:
    """The hooks write at most every 0.1 s: a loop that stops right after a burst of steps leaves the
    log's last frame of the same bar ahead of the record. Both count the same counter: the log's frame
    is then the newer truth."""
    if output is None or output.key != hooks.key or output.reading.format not in ("tqdm", "rich", "keras"):
        return hooks
    epochs = (output.reading.epoch, hooks.reading.epoch)
    same_epoch = None in epochs or epochs[0] == epochs[1]  # "Epoch 3" of the log is no later than epoch 4
    ahead = same_epoch and output.reading.step is not None and (hooks.reading.step or 0) < output.reading.step
    return output if ahead else hooks


def _bar_key(reading: Reading, rank: int | None) -> tuple[Any, ...]:
    """Which bar, whoever saw it: the hooks and the log see the same bar of the same rank alike."""
    return ("bar", rank, _shape(reading.label), reading.total)


def output_candidate(reading: Reading, rank: int | None) -> Candidate:
    return Candidate(reading, "output", "log", rank, _bar_key(reading, rank))


def choose(
    heartbeat: Reading | None,
    hooks: Candidate | None,
    output: Candidate | None,
    output_metrics: Metrics = (),
) -> Candidate | None:
    """The job's progress from its sources. A heartbeat with a step is the job's own word; then the
    hooks' exact bar (when it still runs, or its last update is not older than the output's); then the
    output. What the chosen one lacks the others add: metrics (the Trainer's dicts beside its bar seen
    in-process, a loop's own prints, a heartbeat's), the epoch count (Keras' "Epoch 3/10" line)."""
    chosen: Candidate | None
    if heartbeat is not None and heartbeat.step is not None:
        chosen = Candidate(heartbeat, "heartbeat", "heartbeat", None, ("heartbeat", heartbeat.total))
    elif hooks is not None and (output is None or not hooks.reading.closed or output.reading.closed):
        chosen = _newest_of_same_bar(hooks, output)
        if output is not None and output.reading.format == "hf" and hooks.reading.format == "tqdm":
            chosen = hooks._replace(reading=hooks.reading._replace(format="hf"))
        if output is not None and chosen is not output:
            chosen = chosen._replace(reading=_completed(chosen.reading, output.reading))
    elif output is not None:
        chosen = output
    elif heartbeat is not None:
        chosen = Candidate(heartbeat, "heartbeat", "heartbeat", None, ("heartbeat", None))
    else:
        return None
    if output_metrics and chosen.source != "heartbeat":
        merged = merge_metrics(output_metrics, chosen.reading.metrics)
        chosen = chosen._replace(reading=chosen.reading._replace(metrics=merged))
    if heartbeat is not None and chosen.source != "heartbeat":
        reading = chosen.reading
        merged = merge_metrics(reading.metrics, heartbeat.metrics)
        epoch = reading.epoch if reading.epoch is not None else heartbeat.epoch
        chosen = chosen._replace(reading=reading._replace(metrics=merged, epoch=epoch))
    return chosen


def _completed(reading: Reading, other: Reading) -> Reading:
    """`reading` (the step of the best source) with what `other` adds: its metrics under the reading's
    own, its epoch and epoch count where the reading has none."""
    metrics = merge_metrics(other.metrics, reading.metrics) if other.metrics else reading.metrics
    epoch, epochs = reading.epoch, reading.epochs
    if epoch is None and other.epoch is not None and other.per_epoch == reading.per_epoch:
        epoch = other.epoch
    if epochs is None and other.epochs is not None and reading.epoch is not None:
        epochs = other.epochs
    return reading._replace(metrics=metrics, epoch=epoch, epochs=epochs)

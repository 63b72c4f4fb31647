"""The run's epochs: how a bar of batches, an epoch bar around it, an epoch line above it and the job's
command together say where the whole run stands (DESIGN.md "Progress and speed", the progress of the run).

A reading whose step counts one epoch (`per_epoch`: Lightning's "Epoch 1" bar, Keras' bar under its
"Epoch 3/10", the inner bar of two nested ones, "Epoch 1/3 | step 10/50") is one of `epochs` passes: the
run's fraction and ETA count the epochs before it (model.run_counter). Epochs are shown 1-based, as Keras
prints them; a job whose own labels or lines counted an epoch 0 (Lightning's "Epoch 0") counts from 0,
and its numbers are moved up by one.
"""

from __future__ import annotations

import re

from jobwarden.progress.hints import Hints
from jobwarden.progress.model import Reading, merge_metrics

# an inner bar that is a pass of its own beside the training, not an epoch's batches (Lightning's
# "Validation DataLoader 0", "Sanity Checking", an "eval" bar)
_SIDE_PASS = re.compile(r"(?i)valid|eval|test|predict|sanity")
_RAW_EPOCHS = ("tqdm", "rich", "plain")  # where an epoch number is the job's own, maybe from 0
BOOSTING = ("xgboost", "lightgbm")


def around(outer: Reading, inner: Reading) -> Reading:
    """Two nested bars: an outer one counting epochs (tqdm's `trange(epochs)` at position 0) around a bar
    of batches. The inner bar, its epoch the outer's count, when that is what they are; else the outer."""
    if outer.epoch is not None or outer.per_epoch or not outer.total or outer.step is None:
        return outer  # Lightning's "Epoch 1" bar is the batches' bar; its inner ones are validation
    if inner.step is None or inner.format != outer.format or outer.format not in ("tqdm", "rich"):
        return outer
    if inner.label and _SIDE_PASS.search(inner.label):
        return outer
    # the outer bar counts the epochs done: the inner one runs the next, or has just ended the last
    epoch = max(outer.step, 1) if inner.finished else outer.step + 1
    return inner._replace(
        epoch=float(min(epoch, outer.total)),
        epochs=outer.total,
        per_epoch=True,
        metrics=merge_metrics(outer.metrics, inner.metrics),
        label=inner.label or outer.label,
        closed=inner.closed and outer.closed,
    )


def one_based(reading: Reading, zero: bool) -> Reading:
    """An epoch number the job printed itself, moved up by one where the job counts from 0."""
    if not zero or reading.epoch is None or reading.format not in _RAW_EPOCHS:
        return reading
    return reading._replace(epoch=reading.epoch + 1)


def with_epoch(reading: Reading, line: Reading, zero: bool) -> Reading:
    """A bar under an epoch line ("Epoch 3/10", Keras' or the job's own): one epoch of `epochs`."""
    epoch = line.epoch if line.epoch is not None and not zero else (line.epoch or 0) + 1
    return reading._replace(epoch=epoch, epochs=line.epochs, per_epoch=True)


def epochs_as_steps(line: Reading, zero: bool) -> Reading:
    """Epoch lines and nothing else: the epochs are the steps. A line with metrics reports an epoch that
    has ended ("Epoch 3/10 - loss 0.2"); a bare one announces the epoch that begins ("Epoch 3/10")."""
    n = int(line.epoch or 0) + (1 if zero else 0)
    done = n if line.metrics else n - 1
    return line._replace(step=max(done, 0), total=line.epochs, unit="epoch", epoch=float(n), per_epoch=False)


def with_hints(reading: Reading, hints: Hints) -> Reading:
    """What the job's command says and its output does not: the rounds of a boosting run, the epochs of a
    run whose bars do not print their count (Lightning's tqdm bar, HF's dicts)."""
    if reading.format in BOOSTING and reading.total is None and hints.rounds:
        return reading._replace(total=hints.rounds)
    if reading.epochs is None and reading.epoch is not None and hints.epochs:
        return reading._replace(epochs=hints.epochs)
    return reading

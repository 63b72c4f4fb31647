"""Progress as data: what a source reported (`Reading`, `Bar`) and what every frontend shows (`Progress`).

NamedTuples, not dataclasses: `ps` builds one per job and must start fast (see model.py at the top)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

from jobwarden.clock import iso

Metrics = tuple[tuple[str, float], ...]  # (name, value) in the order reported; a dict in JSON
MAX_METRICS = 16  # a job may log hundreds of values; the list, the store and the charts keep these
MAX_NAME = 40
MAX_LABEL = 120
MAX_COUNT = 10**18  # a step or total beyond this is no counter (and would not fit SQLite's INTEGER)

SOURCES = ("heartbeat", "output")  # DESIGN.md: `source` is one of these
OBSERVED = ("heartbeat", "in-process", "log")  # how jobwarden saw it: the file, the hooks, the output.log


class Reading(NamedTuple):
    """One progress report of one source, as given (no rate: jobwarden measures that itself)."""

    step: int | None
    total: int | None = None
    unit: str | None = None  # "it", "step", "batch", "B"...
    epoch: float | None = None
    metrics: Metrics = ()
    format: str = "tqdm"  # tqdm, keras, hf, megatron, deepspeed, torchtitan, fairseq, heartbeat
    label: str | None = None  # a bar's description ("Epoch 3", "train")
    closed: bool = False  # the bar's last frame: it was closed (or its line ended) and will not move
    epochs: int | None = None  # how many epochs the run has (Keras' "Epoch 3/10", an outer bar's total)
    per_epoch: bool = False  # step/total count one epoch (an inner bar, Lightning's): the run is epochs of it

    @property
    def sane(self) -> bool:
        """Its counters are counters: never negative, never past MAX_COUNT."""
        return all(n is None or 0 <= n <= MAX_COUNT for n in (self.step, self.total))

    @property
    def finished(self) -> bool:
        """Closed, or at its total: a counter that is not expected to move any more (a bar per epoch:
        in the last epoch, or one of an unknown number)."""
        return finished(self)


class Bar(NamedTuple):
    """A progress bar seen in a process of the job by the hooks (exact counters, no parsing)."""

    kind: str  # "tqdm" | "keras"
    n: int
    total: int | None
    unit: str | None
    desc: str | None
    position: int  # tqdm's nested position: 0 is the outer bar
    closed: bool
    postfix: str | None = None  # tqdm's postfix text ("loss=0.12, acc=0.9")
    metrics: Metrics = ()  # Keras' averaged values


class HookProgress(NamedTuple):
    """`<pid>.progress`: the bars of one Python process of the job when it last wrote."""

    pid: int
    rank: int | None
    at: float  # wall time of the write (the process's own clock: the same machine's)
    bars: tuple[Bar, ...]
    epoch: int | None = None  # Keras: the epoch its ProgbarLogger began (1-based, as it prints)


class Progress(NamedTuple):
    """A run's progress as every frontend shows it. `rate` is steps per second measured by jobwarden over
    its own clock (never the bar's own figure, which tqdm smooths and Lightning averages per epoch)."""

    step: int | None
    total: int | None
    rate: float | None
    unit: str | None
    epoch: float | None
    metrics: Metrics
    source: str  # "heartbeat" | "output"
    format: str
    at: float  # wall time of the last change
    label: str | None = None
    observed: str = "log"  # "heartbeat", "in-process" (the hooks) or "log" (output.log parsed)
    rank: int | None = None
    closed: bool = False  # (0 or 1 where the store built it: truthy all the same)
    first_step: int | None = None  # the first step this run showed: where a restarted run resumed
    stalled_since: float | None = None  # wall time: the counter stands still while the job is busy
    epochs: int | None = None  # the run's epochs, where known
    per_epoch: bool = False  # step/total is one epoch's: `rate` counts the run's steps across epochs

    @property
    def bar_fraction(self) -> float | None:
        """How far the bar is (the epoch's batches, for a bar per epoch): "83%" in "ep 2/3 83% 106/128"."""
        if self.step is None or not self.total or self.total <= 0:
            return None
        return min(max(self.step / self.total, 0.0), 1.0)

    @property
    def fraction(self) -> float | None:
        """How far the run is: for a bar per epoch, the epochs before this one and this one's share."""
        done = run_counter(self)
        return None if done is None else min(max(done[0] / done[1], 0.0), 1.0)

    @property
    def epoch_n(self) -> int | None:
        """The epoch the run is in, 1-based, never past the known count (an HF epoch 1.3 is the 2nd)."""
        return epoch_number(self.epoch, self.epochs)

    @property
    def finished(self) -> bool:
        return finished(self)

    @property
    def eta_s(self) -> float | None:
        """Seconds to the end of the run at the measured rate; None when unknown (no total, no rate, a
        closed bar, a bar per epoch whose epoch count is unknown)."""
        done = run_counter(self)
        if done is None or not self.rate or self.rate <= 0 or self.finished:
            return None
        return max(done[1] - done[0], 0) / self.rate

    def metric(self, name: str) -> float | None:
        return next((value for key, value in self.metrics if key == name), None)

    @property
    def loss_name(self) -> str | None:
        return loss_name(key for key, _ in self.metrics)

    @property
    def loss(self) -> float | None:
        name = self.loss_name
        return None if name is None else self.metric(name)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The `progress` object of `ps --json`, `status --json` and the web API (DESIGN.md)."""
        stalled = None
        if self.stalled_since is not None and now is not None:
            stalled = round(max(now - self.stalled_since, 0.0), 1)
        fraction = self.fraction  # a list serialises thousands: each figure worked out once
        eta = self.eta_s
        return {
            "step": self.step,
            "total": self.total,
            "fraction": None if fraction is None else round(fraction, 4),
            "rate": _round(self.rate, 4),
            "unit": self.unit,
            "eta_s": None if eta is None else round(eta, 1),
            "epoch": self._epoch_json(),
            "metrics": dict(self.metrics),
            "source": self.source,
            "format": self.format,
            "at": iso(self.at),
            "label": self.label,
            "observed": self.observed,
            "rank": self.rank,
            "closed": bool(self.closed),  # read back from SQLite as 0 or 1
            "first_step": self.first_step,
            "stalled_for_s": stalled,
        }

    def _epoch_json(self) -> dict[str, int | None] | None:
        n = self.epoch_n
        return None if n is None else {"n": n, "total": self.epochs}


class _Counted(Protocol):
    @property
    def step(self) -> int | None: ...
    @property
    def total(self) -> int | None: ...
    @property
    def epoch(self) -> float | None: ...
    @property
    def epochs(self) -> int | None: ...
    @property
    def per_epoch(self) -> bool: ...
    @property
    def closed(self) -> bool: ...


def finished(p: _Counted) -> bool:
    bar_done = p.closed or (p.total is not None and p.step is not None and p.step >= p.total)
    if not bar_done or not p.per_epoch or not p.epochs:
        return bool(bar_done)
    n = epoch_number(p.epoch, p.epochs)
    return n is None or n >= p.epochs


def epoch_number(epoch: float | None, epochs: int | None) -> int | None:
    """A 1-based epoch as shown ("ep 2/3"): a fractional one (HF's 1.3 epochs done) is the one it is in."""
    if epoch is None or not math.isfinite(epoch):
        return None
    n = max(math.ceil(epoch), 1)
    return min(n, epochs) if epochs else n


def run_counter(p: _Counted) -> tuple[int, int] | None:
    """(steps done, steps in all) of the whole run: a bar per epoch counts epochs x its total, the epochs
    before this one done; any other bar is the run's own counter (HF's global step against max_steps)."""
    if p.step is None or not p.total or p.total <= 0:
        return None
    if not p.per_epoch:
        return p.step, p.total
    n = epoch_number(p.epoch, p.epochs)
    if n is None or not p.epochs:
        return None  # an epoch of an unknown number of them: no fraction of the run
    return (n - 1) * p.total + min(p.step, p.total), p.epochs * p.total


def loss_name(names: Iterable[str]) -> str | None:
    """Which metric is the loss: `loss`, else the first whose name says loss (lm_loss, train_loss),
    validation losses last."""
    found = [name for name in names if "loss" in name.lower()]
    found.sort(key=lambda k: (k.lower() != "loss", "val" in k.lower() or "eval" in k.lower()))
    return found[0] if found else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def finite_metrics(pairs: Any) -> Metrics:
    """(name, value) pairs kept as metrics: finite numbers only (a NaN loss is not a point to chart; HF
    filters them too), short names, at most MAX_METRICS, the first of a name kept."""
    out: dict[str, float] = {}
    for name, value in pairs:
        if len(out) >= MAX_METRICS:
            break
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        number = float(value)
        key = str(name)[:MAX_NAME]
        if math.isfinite(number) and key and key not in out:
            out[key] = number
    return tuple(out.items())


def merge_metrics(*groups: Metrics) -> Metrics:
    """Later groups win a name; the order of first appearance is kept."""
    out: dict[str, float] = {}
    for group in groups:
        out.update(group)
    return tuple(out.items())[:MAX_METRICS]

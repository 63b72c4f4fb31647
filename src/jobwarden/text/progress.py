"""Progress as text: the PROGRESS column of `ps` and `top` ("45% 450/1000 5.4it/s ETA 1m42s", "step 4500
5.4it/s", "ep 2/3 83% 106/128 18.7it/s ETA 1m12s": the epoch's bar, the ETA of the whole run), and the
progress lines of `status` and `explain` ("stopped at 62%, step 620/1000").

The bar's description, its unit and the metric names come from the job: each goes through one_line."""

from __future__ import annotations

from jobwarden.config import format_duration
from jobwarden.progress.model import Progress
from jobwarden.text.sanitize import one_line

_UNITS = {"iteration": "it", "iterations": "it", "update": "upd"}
METRICS_SHOWN = 3


def _unit(p: Progress) -> str:
    unit = one_line(p.unit or "it")[:12]
    return _UNITS.get(unit, unit)


def rate_text(p: Progress) -> str | None:
    """ "5.40it/s", "12.3s/it" below one a second (as tqdm turns it), None when unmeasured."""
    if p.rate is None or p.rate <= 0:
        return None
    unit = _unit(p)
    if p.rate < 1:
        return f"{_figure(1 / p.rate)}s/{unit}"
    return f"{_figure(p.rate)}{unit}/s"


def _figure(value: float) -> str:
    """Three significant figures, no exponent: 5.4, 5.43, 54.3, 543, 5432."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def counter_text(p: Progress) -> str:
    """ "45% 450/1000", "step 4500", "ep 2/3 83% 106/128" (a bar of the 2nd of 3 epochs), "ep 2" (a
    Trainer's dicts alone: its epoch 1.3 is the 2nd), "" when nothing is known."""
    if p.step is None:
        return _epoch_only(p)
    counter = f"{whole_percent(p.bar_fraction)}% {p.step}/{p.total}" if p.total else f"step {p.step}"
    epoch = epoch_text(p)
    return f"{epoch} {counter}" if epoch else counter


def _epoch_only(p: Progress) -> str:
    n = p.epoch_n
    if n is None:
        return ""
    return f"ep {n}/{p.epochs}" if p.epochs else f"ep {n}"


def epoch_text(p: Progress) -> str:
    """ "ep 2/3", "ep 2" (of an unknown number); "" when the bar counts the epochs themselves."""
    if p.step is None or p.unit == "epoch":
        return ""
    return _epoch_only(p)


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}".rstrip("0")


def whole_percent(fraction: float | None) -> int:
    """As tqdm's bar rounds it (`{percentage:3.0f}`: half to even) and the web page (common.js
    wholePercent) too: one figure everywhere; and 100 only at the end (99.6 % is not a run done)."""
    share = (fraction or 0.0) * 100
    return min(round(share), 99) if share < 100 else int(share)


def progress_cell(p: Progress | None, live: bool, now: float | None = None) -> str:
    """One cell: the counter; for a live run its rate and ETA too, or how long it has stood still."""
    if p is None:
        return "-"
    parts = [counter_text(p)]
    if live and not p.finished:
        rate = rate_text(p)
        if p.stalled_since is not None and now is not None:
            parts.append(f"stalled {format_duration(now - p.stalled_since)}")
        elif rate:
            parts.append(rate)
            if p.eta_s is not None:
                parts.append(f"ETA {format_duration(round(p.eta_s))}")
    return " ".join(part for part in parts if part) or "-"


def metrics_text(p: Progress, most: int = METRICS_SHOWN) -> str:
    """ "loss 0.123, lr 5e-05": the loss first, then what else the job reported."""
    names = [k for k, _ in p.metrics]
    loss = p.loss_name
    if loss is not None:
        names.remove(loss)
        names.insert(0, loss)
    return ", ".join(f"{one_line(k)} {p.metric(k):.4g}" for k in names[:most])


def progress_line(p: Progress, live: bool, now: float) -> str:
    """`status`: where it stands, how fast, until when; or, ended, where it stopped."""
    if live:
        where = progress_cell(p, True, now)
    else:
        reached = p.step is not None and p.total is not None and p.step >= p.total
        verb = "reached" if reached else "stopped at"  # a bar closed by a crash stopped where it was
        # the run's share where known, else the bar's; a bar per epoch says which epoch
        shown = p.fraction if p.fraction is not None else p.bar_fraction
        epoch = epoch_text(p)
        if p.step is not None and p.total and epoch and p.per_epoch:
            verb = "reached" if reached and p.finished else "stopped at"
            where = f"{verb} {whole_percent(shown)}%, epoch {epoch[3:]}, step {p.step}/{p.total}"
        elif p.step is not None and p.total:
            where = f"{verb} {whole_percent(shown)}%, step {p.step}/{p.total}"
        elif p.step is not None:
            where = f"{verb} step {p.step}"
        else:
            where = counter_text(p) or "-"
    details = []
    shown = live or (p.per_epoch and p.total)  # the epoch is in `where` already
    if p.epoch is not None and p.step is not None and not shown and "epoch" not in (p.label or "").lower():
        details.append(f"epoch {_number(p.epoch)}")
    metrics = metrics_text(p)
    if metrics:
        details.append(metrics)
    label = f" [{one_line(p.label)[:40]}]" if p.label else ""
    tail = f"; {'; '.join(details)}" if details else ""
    return f"{where}{tail}{label} ({source_text(p)}, {format_duration(now - p.at)} ago)"


def source_text(p: Progress) -> str:
    """ "tqdm, read in-process", "megatron, from the log", "heartbeat"."""
    how = {"in-process": "read in-process", "log": "from the log"}.get(p.observed)
    return f"{one_line(p.format)}, {how}" if how else one_line(p.format)


def resumed_line(p: Progress | None, before: Progress | None, before_run: int) -> str | None:
    """A restarted run: where it began, against how far the run before it got."""
    if p is None or p.first_step is None or before is None or before.step is None:
        return None
    got = f"{before.step}/{before.total}" if before.total else str(before.step)
    return f"resumed at step {p.first_step} (run {before_run} had reached {got})"

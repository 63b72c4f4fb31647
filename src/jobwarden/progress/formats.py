"""One frame of output, parsed: which progress format it is, and what it says.

Each parser takes a frame without escapes (frames.Frame.clean) and returns a `Reading`, or None when the
frame is not of its format. Formats and their sources: research/slowness.md §3 (tqdm's std.py format_meter
and status_printer; Lightning's TQDMProgressBar; HF Trainer's ProgressCallback; Keras 2 and 3 Progbar;
Megatron's training_log; DeepSpeed's ThroughputTimer and engine step log; torchtitan's MetricsProcessor;
fairseq's SimpleProgressBar). Every pattern is anchored on text the format always prints after the
counters (tqdm's closing `]`, Keras' `ms/step`, Megatron's `|`), so that a frame cut short never yields a
wrong step: it does not match at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from jobwarden.progress.model import MAX_LABEL, Metrics, Reading, finite_metrics

_NUM = r"\d+(?:\.\d+)?"
_SI = _NUM + r"[kMGTPEZY]?"
_TIME = r"(?:\d+:)*\d{1,2}:\d{2}"
_VALUE = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_SCALE = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SCALE.update({"Z": 10**21, "Y": 10**24})

# tqdm's right part: "{n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]", or without a
# total "{n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]"; the left part "{desc}: {percentage}%|{bar}| "
_TQDM = re.compile(
    rf"(?<![\w.])(?P<n>{_SI})(?:/(?P<total>{_SI}|\?))?(?P<unit>[A-Za-z_]{{0,20}})\s*"
    rf"\[(?:{_TIME})(?:<(?:{_TIME}|\?))?,\s*(?:\?|{_SI})(?P<rate_unit>[^\],\s]{{0,24}})"
    r"(?:,\s*(?P<postfix>[^\]]{0,1000}))?\]"
)
_TQDM_LEFT = re.compile(r"^(?:(?P<desc>[^|]*?):\s*)?(?:\d{1,3}%\|[^|]*\|\s*)?$")
EPOCH_IN_LABEL = re.compile(r"(?i)\bepoch\s*(\d+)")
EPOCHS_IN_LABEL = re.compile(r"(?i)\bepoch\s*(\d{1,9})\s*/\s*(\d{1,9})\b")  # "Epoch 2/10"
MAX_EPOCHS = 10**9
KEY_VALUES = re.compile(rf"(?P<k>[A-Za-z_][\w./-]{{0,39}})\s*=\s*(?P<v>{_VALUE})(?![\w.])")
# Keras 3 "123/500 ━━━━ 1:23 12ms/step - loss: 0.1234" (and verbose=2 "500/500 - 5s - 10ms/step - ...");
# Keras 2 " 123/500 [====>....] - ETA: 1:23 - loss: 0.1234", its last frame "- 5s 10ms/step - loss: ..."
_KERAS = re.compile(
    r"^(?P<n>\d+)/(?P<total>\d+|Unknown)\s(?:(?!\d+/).){0,200}?\d(?:ms|us|µs|s)/(?P<unit>step|sample)"
    r"(?P<rest>.*)$"
)
_KERAS2 = re.compile(r"^(?P<n>\d+)/(?P<total>\d+) \[[=>.]*\] - ETA: \S+(?P<rest>.*)$")
# rich.progress as Lightning's RichProgressBar configures it (its default bar where rich is installed):
# "Epoch 1/9  ━━━━━━╺━━━━ 7/16 0:00:02 • 0:00:03 4.21it/s train_loss: 0.110". Piped, rich prints only
# the last frame at the end (research/slowness.md §3.2); forced (TTY_COMPATIBLE=1) it redraws with \r, the
# remaining time wrapped to the next line when the frame is wider than its console.
_RICH = re.compile(
    rf"^(?P<desc>.*?)\s*(?P<n>\d+)/(?P<total>\d+|--)\s+{_TIME}\s+•\s+(?:(?:{_TIME}|-:--:--)\s+)?"
    r"(?:[\d.]+|\?)it/s(?P<rest>.*)$"
)
_RICH_METRIC = re.compile(rf"(?P<k>[A-Za-z_][\w./-]{{0,39}}):\s*(?P<v>{_VALUE})(?![\w.])")
_KERAS_METRIC = re.compile(rf" - (?P<k>[A-Za-z_][\w ]{{0,39}}?): (?P<v>{_VALUE})")
KERAS_EPOCH = re.compile(r"^Epoch (?P<epoch>\d+)/(?P<epochs>\d+)$")
# Lightning's RichProgressBar describes its bar "Epoch {current_epoch}/{max_epochs - 1}": 0-based, both
LIGHTNING_RICH_EPOCH = re.compile(r"^Epoch (?P<epoch>\d+)/(?P<last>\d+)$")
# Megatron: " [ts] iteration 10/ 1000 | consumed samples: 320 | elapsed time per iteration (ms): 12.3 | ..."
_MEGATRON = re.compile(r"\biteration\s+(?P<n>\d+)/\s*(?P<total>\d+)\s*\|(?P<rest>.*\|)")
_MEGATRON_METRIC = re.compile(rf"\|\s*(?P<k>[A-Za-z][A-Za-z /()-]{{0,60}}?):\s*(?P<v>{_VALUE})\s*(?=\|)")
# DeepSpeed: ThroughputTimer "epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=25.02, ..."
# and the engine's "step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
_DEEPSPEED = re.compile(
    r"\bepoch=(?P<epoch>\d+)/micro_step=\d+/global_step=(?P<n>\d+),(?P<rest>.*\bCurrSamplesPerSec=.*)$"
)
_DEEPSPEED_STEP = re.compile(r"(?<![\w/])step=(?P<n>\d+), skipped=(?P<skipped>\d+), lr=\[(?P<lr>[^\],]*)")
# torchtitan: "step:  10  loss:  7.4213  grad_norm:  1.2345  memory: 12.34GiB(15.61%)  tps: 1,234  ..."
_TITAN = re.compile(rf"(?<!validate )\bstep:\s*(?P<n>\d+)\s+loss:\s*(?P<loss>{_VALUE})(?P<rest>.*)$")
_TITAN_METRIC = re.compile(rf"(?P<k>[a-z_]{{1,40}}):\s*(?P<v>{_VALUE})")
# fairseq's simple bar (its tqdm bar when stderr is not a terminal): "epoch 001:    100 / 1000 loss=9.87, ..."
_FAIRSEQ = re.compile(r"\bepoch (?P<epoch>\d+):\s+(?P<n>\d+) / (?P<total>\d+)(?P<rest>(?: .*)?)$")
# HF Trainer's log dict: "{'loss': 0.52, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 1.3}", newer
# versions with the numbers as strings ("'loss': '0.52'"), a NaN as bare `nan`
_HF_KEYS = ("'loss'", "'eval_loss'", "'train_runtime'", "'learning_rate'", "'grad_norm'", "'train_loss'")
_HF_PAIR = re.compile(rf"'(?P<k>[\w./-]{{1,40}})':\s*'?(?P<v>{_VALUE})'?(?=\s*[,}}])")


# A training loop's own prints: "Epoch 1/3 | step 10/50 | loss 0.1", "iter 500 / 10000, loss=0.1",
# "epoch 0/2 step 7/8 loss: 0.25" behind the logging module's prefix. A counter counts only where it stands
# as a field: at the start, or after a separator or a logging prefix, and followed by the end, a separator
# or what a field holds (a metric, another counter) -- "at step 3/4 of the install" is prose, not progress.
_PLAIN_COUNTER = re.compile(
    r"(?i)(?P<kw>epoch|step|iter|iteration)s?\b[ \t]*[:#=]?[ \t]*(?P<n>\d{1,18})"
    r"[ \t]*/[ \t]*(?P<total>\d{1,18})(?![\w/.])"
)
_PLAIN_BEFORE = re.compile(r"(?:^|[|,;\[(]\s*|[:\])>]\s*|\s-+\s+|\s\s|\t)$")
_PLAIN_FIELD = rf"[A-Za-z_][\w.]{{0,39}}[ \t]*[:=]?[ \t]*(?:{_VALUE})(?![\w./%])"
_PLAIN_AFTER = re.compile(
    rf"(?i)[\s|,;:\-\])]*(?:$|(?:epoch|step|iter|iteration)s?\b|{_PLAIN_FIELD}|\(?\d+(?:\.\d+)?%\)?(?:\s|$))"
)
_PLAIN_METRIC = re.compile(
    rf"(?<![\w./])(?P<k>[A-Za-z_][\w.]{{0,39}})[ \t]*[:=]?[ \t]*(?P<v>{_VALUE})(?![\w./%])"
)
_PLAIN_SKIP = ("epoch", "epochs", "step", "steps", "iter", "iters", "iteration", "iterations")
_PLAIN_UNITS = {"iter": "it", "iteration": "it", "step": "step", "epoch": "epoch"}
# Gradient boosting's evaluation lines (one per round, or every period): XGBoost's EvaluationMonitor
# "[37]\tvalid-logloss:0.41\t..." (0-based rounds), LightGBM's log_evaluation
# "[37]\tvalid_0's binary_logloss: 0.41\t..." (1-based); each field a data set and a metric
_BOOST_HEAD = re.compile(r"^\[(?P<n>\d{1,9})\]\t")
_XGB_FIELD = re.compile(
    rf"^(?P<data>[\w.]{{1,40}})-(?P<metric>[\w@.:-]{{1,40}}?):(?P<v>{_VALUE})(?:\+(?:{_VALUE}))?$"
)
_LGB_FIELD = re.compile(
    rf"^(?P<data>[\w.]{{1,40}})'s (?P<metric>[\w@.:-]{{1,40}}): (?P<v>{_VALUE})(?: \+ (?:{_VALUE}))?$"
)


def number(text: str) -> float:
    """A printed number: "1,234" -> 1234.0; "2.00k" (tqdm's unit_scale) -> 2000.0."""
    text = text.replace(",", "")
    if text and text[-1] in _SCALE:
        return float(text[:-1]) * _SCALE[text[-1]]
    return float(text)


def _count(text: str) -> int:
    return round(number(text))


def metrics_of(pattern: re.Pattern[str], text: str, skip: tuple[str, ...] = ()) -> Metrics:
    pairs = []
    for m in pattern.finditer(text):
        key = _key(m.group("k"))
        if key and key not in skip:
            try:
                pairs.append((key, number(m.group("v"))))
            except ValueError:
                continue
    return finite_metrics(pairs)


def _key(name: str) -> str:
    """ "lm loss" -> "lm_loss"; "elapsed time per iteration (ms)" -> "elapsed_time_per_iteration_ms"."""
    return re.sub(r"[^0-9A-Za-z_.]+", "_", name.strip()).strip("_")


def parse_tqdm(frame: str) -> Reading | None:
    if "[" not in frame or ("/s" not in frame and "s/" not in frame):
        return None
    right = _TQDM.search(frame)
    if right is None:
        return None
    left = _TQDM_LEFT.match(frame[: right.start()])
    label = left.group("desc") if left else None
    label = label.strip()[:MAX_LABEL] or None if label else None
    total = right.group("total")
    rate_unit = right.group("rate_unit")
    unit = right.group("unit") or None
    if unit is None and rate_unit.startswith("s/"):
        unit = rate_unit[2:] or None
    elif unit is None and rate_unit.endswith("/s"):
        unit = rate_unit[:-2] or None
    epoch = EPOCH_IN_LABEL.search(label) if label else None
    postfix = right.group("postfix") or ""
    return Reading(
        step=_count(right.group("n")),
        total=_count(total) if total and total != "?" else None,
        unit=unit,
        epoch=float(epoch.group(1)) if epoch else None,
        per_epoch=epoch is not None,  # a bar described "Epoch 3" counts that epoch's batches
        metrics=metrics_of(KEY_VALUES, postfix, skip=("v_num",)),  # v_num: Lightning's logger version
        format="tqdm",
        label=label,
    )


def label_epochs(label: str | None, rich: bool = False) -> dict[str, Any]:
    """A bar's epoch from its description: "Epoch 3" (a bar of that epoch's batches), "Epoch 3/10", as
    printed; from rich, Lightning's "Epoch 1/2" (0-based, the last index after the slash: the 2nd of 3)."""
    if not label:
        return {}
    last = LIGHTNING_RICH_EPOCH.match(label) if rich else None
    if last is not None:
        n, epochs = float(last.group("epoch")) + 1, int(last.group("last")) + 1
        return {"epoch": n, "epochs": epochs, "per_epoch": True}
    of = EPOCHS_IN_LABEL.search(label)
    if of is not None and 0 < int(of.group(2)) <= MAX_EPOCHS and int(of.group(1)) <= int(of.group(2)):
        return {"epoch": float(of.group(1)), "epochs": int(of.group(2)), "per_epoch": True}
    epoch = EPOCH_IN_LABEL.search(label)
    return {"epoch": float(epoch.group(1)), "per_epoch": True} if epoch else {}


def parse_keras(frame: str) -> Reading | None:
    if "/" not in frame[:24]:
        return None
    m = _KERAS.match(frame) or _KERAS2.match(frame)
    if m is None:
        return None
    total = m.group("total")
    unit = m.group("unit") if "unit" in m.re.groupindex else "step"
    return Reading(
        step=int(m.group("n")),
        total=int(total) if total.isdigit() else None,
        unit=unit,
        metrics=metrics_of(_KERAS_METRIC, m.group("rest")),
        format="keras",
    )


def parse_rich(frame: str) -> Reading | None:
    if "•" not in frame or "it/s" not in frame:
        return None
    m = _RICH.match(frame)
    if m is None:
        return None
    label = m.group("desc").rstrip("━╸╺─ ").strip()[:MAX_LABEL] or None
    total = m.group("total")
    return Reading(
        step=int(m.group("n")),
        total=int(total) if total.isdigit() else None,
        unit="it",
        **label_epochs(label, rich=True),
        metrics=metrics_of(_RICH_METRIC, m.group("rest"), skip=("v_num",)),
        format="rich",
        label=label,
    )


def parse_megatron(frame: str) -> Reading | None:
    if "iteration" not in frame:
        return None
    m = _MEGATRON.search(frame)
    if m is None:
        return None
    return Reading(
        step=int(m.group("n")),
        total=int(m.group("total")),
        unit="iteration",
        metrics=metrics_of(_MEGATRON_METRIC, "|" + m.group("rest")),
        format="megatron",
    )


def parse_deepspeed(frame: str) -> Reading | None:
    if "step=" not in frame:
        return None
    m = _DEEPSPEED.search(frame)
    if m is not None:
        return Reading(
            step=int(m.group("n")),
            unit="step",
            epoch=float(m.group("epoch")),
            metrics=metrics_of(KEY_VALUES, m.group("rest")),
            format="deepspeed",
        )
    m = _DEEPSPEED_STEP.search(frame)
    if m is None:
        return None
    try:
        lr: Metrics = finite_metrics([("lr", number(m.group("lr").strip()))])
    except ValueError:
        lr = ()
    return Reading(step=int(m.group("n")), unit="step", metrics=lr, format="deepspeed")


def parse_torchtitan(frame: str) -> Reading | None:
    if "step:" not in frame or "loss:" not in frame:
        return None
    m = _TITAN.search(frame)
    if m is None:
        return None
    loss = finite_metrics([("loss", number(m.group("loss")))])
    return Reading(
        step=int(m.group("n")),
        unit="step",
        metrics=loss + metrics_of(_TITAN_METRIC, m.group("rest"))[: 16 - len(loss)],
        format="torchtitan",
    )


def parse_fairseq(frame: str) -> Reading | None:
    if "epoch " not in frame or " / " not in frame:
        return None
    m = _FAIRSEQ.search(frame)
    if m is None:
        return None
    return Reading(
        step=int(m.group("n")),
        total=int(m.group("total")),
        unit="update",
        epoch=float(m.group("epoch")),
        metrics=metrics_of(KEY_VALUES, m.group("rest")),
        format="fairseq",
    )


def parse_hf_dict(frame: str) -> Reading | None:
    """A Trainer log dict: metrics and the epoch, no step (the bar beside it has the step)."""
    if not (frame.startswith("{'") and frame.endswith("}")) or not any(k in frame for k in _HF_KEYS):
        return None
    pairs = [(m.group("k"), m.group("v")) for m in _HF_PAIR.finditer(frame)]
    values = []
    for key, text in pairs:
        try:
            values.append((key, number(text)))
        except ValueError:
            continue
    found = dict(finite_metrics(values))
    epoch = found.pop("epoch", None)
    return Reading(step=None, epoch=epoch, metrics=tuple(found.items()), format="hf")


def parse_plain(frame: str) -> Reading | None:
    """A home-made print with an epoch and/or a step counter (and its metrics); an epoch alone gives a
    reading without a step (the epoch of whatever bar runs beside it)."""
    if "/" not in frame:
        return None
    low = frame.lower()  # a fast pre-check: most lines with a slash are paths and URLs
    if "step" not in low and "epoch" not in low and "iter" not in low:
        return None
    epoch: tuple[int, int] | None = None
    step: tuple[str, int, int] | None = None
    first = -1
    for m in _PLAIN_COUNTER.finditer(frame):
        if first < 0:
            if not _PLAIN_BEFORE.search(frame, 0, m.start()) or not _PLAIN_AFTER.match(frame, m.end()):
                return None
            first = m.start()
        kw = m.group("kw").lower()
        n, total = int(m.group("n")), int(m.group("total"))
        if total <= 0 or n > total:
            return None  # "3/0", "12/10": a date, a ratio, not a counter
        if kw == "epoch":
            epoch = epoch or (n, total)
        elif step is None:
            step = (kw, n, total)
    if first < 0:
        return None
    rest = _PLAIN_COUNTER.sub(" ", frame[first:])
    metrics = metrics_of(_PLAIN_METRIC, rest, skip=_PLAIN_SKIP)
    return Reading(
        step=step[1] if step else None,
        total=step[2] if step else None,
        unit=_PLAIN_UNITS.get(step[0], "step") if step else "epoch",
        epoch=float(epoch[0]) if epoch else None,
        epochs=epoch[1] if epoch else None,
        per_epoch=epoch is not None and step is not None,
        metrics=metrics,
        format="plain",
    )


def parse_boosting(frame: str) -> Reading | None:
    """An evaluation line of XGBoost or LightGBM: the round (1-based, as both count it in their totals),
    the metrics as `data-metric`; the number of rounds comes from the job's command (progress.hints)."""
    if not frame.startswith("[") or "\t" not in frame[:12]:
        return None
    head = _BOOST_HEAD.match(frame)
    if head is None:
        return None
    fields = frame[head.end() :].split("\t")
    lightgbm = "'s " in fields[0]
    pattern = _LGB_FIELD if lightgbm else _XGB_FIELD
    pairs = []
    for field in fields[:64]:
        m = pattern.match(field.strip())
        if m is None:
            return None  # every field is a data set's metric, or the line is something else
        try:
            pairs.append((f"{m.group('data')}-{m.group('metric')}", number(m.group("v"))))
        except ValueError:
            continue
    n = int(head.group("n"))
    return Reading(
        step=n if lightgbm else n + 1,
        unit="round",
        metrics=finite_metrics(pairs),
        format="lightgbm" if lightgbm else "xgboost",
    )


# the bars (redrawn with \r, the newest frame may still be written) and the log lines (complete only)
BAR_PARSERS: tuple[Callable[[str], Reading | None], ...] = (parse_tqdm, parse_keras, parse_rich)
LINE_PARSERS: tuple[Callable[[str], Reading | None], ...] = (
    parse_megatron,
    parse_deepspeed,
    parse_torchtitan,
    parse_fairseq,
    parse_boosting,
    parse_plain,  # last: the loosest
)


def parse_bar(frame: str) -> Reading | None:
    return _first_sane(BAR_PARSERS, frame)


def parse_line(frame: str) -> Reading | None:
    return _first_sane(LINE_PARSERS, frame)


def _first_sane(parsers: tuple[Callable[[str], Reading | None], ...], frame: str) -> Reading | None:
    for parse in parsers:
        found = parse(frame)
        if found is not None:
            return found if found.sane else None  # "99999999999999999999/1" is no bar of a job
    return None

"""`jobwarden metrics` in a terminal, and the sparklines of `status`: one line per metric, its history
as a sparkline, then its current and largest value."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from jobwarden.clock import shown_time
from jobwarden.config import format_duration, format_size
from jobwarden.control.views.metrics import Sample, per_second, sparkline
from jobwarden.progress.model import loss_name
from jobwarden.text.sanitize import one_line
from jobwarden.text.term import colour_wanted

LABEL_WIDTH = 13
FIGURES_WIDTH = 28  # "  now 100.0%  max 100.0%"


class Series(NamedTuple):
    label: str
    values: list[float | None]
    show: Callable[[float], str]
    peaks: list[float | None] | None = None  # a rollup point's max: the spike its mean hides


def _percent(value: float) -> str:
    return f"{value:.0f}%"


def _size(value: float) -> str:
    return format_size(round(value))


def _rate(value: float) -> str:
    return format_size(round(value)) + "/s"


def _count(value: float) -> str:
    return f"{value:.0f}"


def _per_second(value: float) -> str:
    return f"{value:.3g}/s"


def _figure(value: float) -> str:
    return f"{value:.4g}"


def _loss_name(samples: Sequence[Sample]) -> str | None:
    return loss_name(dict.fromkeys(name for s in samples for name, _ in s.metrics))


def series(samples: Sequence[Sample]) -> list[Series]:
    """The metrics worth a line: CPU, RSS and processes always; I/O where readable; GPU where used."""
    out = [
        Series(
            "CPU",
            [s.cpu_percent for s in samples],
            _percent,
            [_peak(s.cpu_max_percent, s.cpu_percent) for s in samples],
        ),
        Series(
            "RSS",
            [_f(s.rss_bytes) for s in samples],
            _size,
            [_peak(s.rss_max_bytes, s.rss_bytes) for s in samples],
        ),
        Series("processes", [_f(s.nprocs) for s in samples], _count),
    ]
    if any(s.io_read_bytes is not None for s in samples):
        out.append(Series("I/O read/s", per_second(samples, "io_read_bytes"), _rate))
        out.append(Series("I/O write/s", per_second(samples, "io_write_bytes"), _rate))
    if any(s.step_rate is not None for s in samples):
        out.append(Series("steps/s", [s.step_rate for s in samples], _per_second))
    loss = _loss_name(samples)
    if loss is not None:
        label = one_line(loss)[: LABEL_WIDTH - 1]  # named by the job
        out.append(Series(label, [dict(s.metrics).get(loss) for s in samples], _figure))
    gpus = sorted({g.index for s in samples for g in s.gpus})
    if gpus:
        out.append(Series("GPU util", [s.gpu_util for s in samples], _percent))
        out.append(Series("GPU memory", [_f(s.gpu_memory_bytes) for s in samples], _size))
    for index in gpus if len(gpus) > 1 else []:
        per = [{g.index: g for g in s.gpus}.get(index) for s in samples]
        out.append(Series(f"GPU {index} util", [g.util if g else None for g in per], _percent))
        out.append(Series(f"GPU {index} mem", [_f(g.memory_bytes) if g else None for g in per], _size))
    return out


def spark_width(width: int, indent: str = "  ") -> int:
    """Characters left for the sparkline in a terminal `width` columns wide: one point each."""
    return max(width - len(indent) - LABEL_WIDTH - FIGURES_WIDTH, 8)


def metric_lines(samples: Sequence[Sample], width: int, indent: str = "  ") -> Iterator[str]:
    """One line per metric, fitted to `width` columns."""
    chars = spark_width(width, indent)
    for s in series(samples):
        known = [v for v in s.values if v is not None]
        peaks = [v for v in (s.peaks or s.values) if v is not None]
        now = s.show(known[-1]) if known else "-"
        top = s.show(max(peaks)) if peaks else "-"
        top_of_scale = 100.0 if s.show is _percent and (max(peaks, default=0) <= 100) else None
        spark = sparkline(s.values, chars, top=top_of_scale)
        line = _paint(spark) + " " * (chars - len(spark))
        yield f"{indent}{s.label:<{LABEL_WIDTH}}{line}  now {now:>8}  max {top:>8}"


def metrics_report(name: str, job_id: int, run: int, samples: Sequence[Sample], width: int) -> Iterator[str]:
    if not samples:
        yield f"job {job_id} ({one_line(name)}), run {run}: no samples yet"
        return
    span = samples[-1].at - samples[0].at
    step = max((s.step_s for s in samples), default=0.0)
    resolution = f"points of {format_duration(step)}" if step else "every sample"
    yield (
        f"job {job_id} ({one_line(name)}), run {run}: {len(samples)} samples over {format_duration(span)} "
        f"({resolution}), from {shown_time(samples[0].at)} to {shown_time(samples[-1].at)}"
    )
    yield from metric_lines(samples, width)


def status_sparklines(samples: Sequence[Sample], width: int) -> Iterator[str]:
    """CPU and RSS of the last minutes, for `status`."""
    if len(samples) < 2:
        return
    minutes = max(round((samples[-1].at - samples[0].at) / 60), 1)
    yield ""
    yield f"  last {minutes} min"
    for line in metric_lines(samples, width, indent="    "):
        if line.strip().startswith(("CPU", "RSS", "steps/s")):
            yield line


def _paint(text: str) -> str:
    """Sparklines in cyan on a terminal, plain with NO_COLOR or into a pipe."""
    return f"\033[36m{text}\033[0m" if colour_wanted() else text


def _f(value: int | None) -> float | None:
    return None if value is None else float(value)


def _peak(peak: float | None, value: float | None) -> float | None:
    return value if peak is None else peak

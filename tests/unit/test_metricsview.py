"""`jobwarden metrics` as text: one sparkline line per metric, fitted to the terminal, coloured only on a
terminal without NO_COLOR."""

from __future__ import annotations

import io

import pytest

from jobwarden.cli.metricsview import metric_lines, metrics_report, status_sparklines
from jobwarden.control.views.metrics import GpuSample, Sample

T0 = 1_700_000_400.0
MIB = 1 << 20


def samples(n: int = 300, gpus: int = 2) -> list[Sample]:
    return [
        Sample(
            at=T0 + i,
            cpu_percent=float(i % 100),
            rss_bytes=(100 + i) * MIB,
            nprocs=4,
            io_read_bytes=i * MIB,
            io_write_bytes=2 * i * MIB,
            gpu_util=50.0 if gpus else None,
            gpu_memory_bytes=gpus * 2048 * MIB if gpus else None,
            cpu_time_s=float(i),
            gpus=tuple(GpuSample(g, 50.0, 2048 * MIB) for g in range(gpus)),
        )
        for i in range(n)
    ]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("width", [60, 80, 200])
def test_every_line_fits_the_terminal(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    lines = list(metric_lines(samples(), width))
    labels = [line.split("  ")[1].strip() for line in lines]
    assert labels[:7] == ["CPU", "RSS", "processes", "I/O read/s", "I/O write/s", "GPU util", "GPU memory"]
    assert {"GPU 0 util", "GPU 1 mem"} <= set(labels)
    assert all(len(line) <= width for line in lines)


def test_current_and_largest_values_are_shown() -> None:
    (cpu, rss, *_) = metric_lines(samples(gpus=0), 100)
    assert "now      99%" in cpu and "max      99%" in cpu
    assert "max   399.0M" in rss
    assert not any("GPU" in line for line in metric_lines(samples(gpus=0), 100))


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("sys.stdout", _Tty())
    assert "\033[36m" in next(metric_lines(samples(), 100))
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\033[" not in next(metric_lines(samples(), 100))


def test_a_run_without_samples_says_so() -> None:
    assert list(metrics_report("train.py", 7, 1, [], 80)) == ["job 7 (train.py), run 1: no samples yet"]
    assert list(status_sparklines([], 80)) == []


def test_status_shows_only_cpu_and_rss() -> None:
    lines = list(status_sparklines(samples(600), 100))
    assert lines[1] == "  last 10 min"
    assert [line.split()[0] for line in lines[2:]] == ["CPU", "RSS"]

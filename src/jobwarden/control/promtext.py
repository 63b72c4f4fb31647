"""The Prometheus text exposition format (version 0.0.4), written by hand: jobwarden has no runtime
dependency for it, and the format is a few rules.

- Each family's `# HELP`, `# TYPE` and samples are contiguous: a parser that meets samples after another
  family's header files them under a new `unknown`-typed family (prometheus_client does; promtool does
  not complain, so the tests parse the output too).
- Label values escape backslash, double quote and newline; HELP text escapes backslash and newline.
- No timestamps: Prometheus stamps a scrape itself, and an exporter's own stamps break staleness.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Family:
    """One metric family: its name, type (gauge or counter), help, and samples. A counter's name ends
    in `_total`, and so do its samples."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"unsupported metric type {kind!r}")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"a counter's name ends in _total: {name}")
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[tuple[tuple[tuple[str, str], ...], float]] = []

    def add(self, value: float, **labels: str) -> None:
        """A sample; `None` values are the caller's to leave out (unknown is not zero)."""
        self.samples.append((tuple(labels.items()), value))

    def lines(self) -> Iterator[str]:
        yield f"# HELP {self.name} {_escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in self.samples:
            yield f"{self.name}{_labels(labels)} {format_value(value)}"


def render(families: Iterable[Family]) -> str:
    """The exposition: each family whole, in the order given, ending with a newline."""
    return "".join(f"{line}\n" for family in families for line in family.lines())


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{escape_label_value(value)}"' for key, value in labels) + "}"

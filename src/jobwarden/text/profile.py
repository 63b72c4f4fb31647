"""`jobwarden profile`'s report: where the job's time went, largest share first. Function and file names
come from the job's code: sanitised (text.sanitize) before a terminal sees them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from jobwarden.text.sanitize import one_line

SHOWN = 15


def frame_label(entry: Mapping[str, Any]) -> str:
    where = str(entry.get("file") or "")
    if entry.get("line"):
        where += f":{entry['line']}"
    return (
        f"{one_line(str(entry.get('function', '?')))} ({one_line(where)})"
        if where
        else one_line(str(entry.get("function", "?")))
    )


def profile_report(summary: Mapping[str, Any], path: str | None = None) -> Iterator[str]:
    processes = summary.get("processes") or []
    yield (
        f"job {summary['id']} run {summary['run']}: {summary['samples']} samples of {len(processes)} "
        f"processes, {summary['duration_s']}s at {summary['rate_hz']} Hz"
    )
    io = summary.get("io_wait_fraction") or 0.0
    if io >= 0.005:
        yield f"waiting on I/O (D state): {io:.0%} of the samples"
    top = summary.get("top") or []
    if top:
        yield ""
        yield " SHARE  FUNCTION (FILE:LINE)"
        for entry in top[:SHOWN]:
            yield f"{entry['fraction'] * 100:5.1f}%  {frame_label(entry)}"
    for note in summary.get("notes") or []:
        yield f"note: {one_line(str(note))}"
    if path:
        yield f"stored: {path} (speedscope JSON: https://www.speedscope.app)"


def profile_line(summary: Mapping[str, Any], shown: int = 3) -> str:
    """One line for `explain`: where the newest profile found the time spent (the innermost frames of the
    samples: what the job was doing, not the `<module>` and `main` every sample passes through)."""
    hot = list(summary.get("hot") or summary.get("top") or [])
    frames = ", ".join(f"{e['fraction']:.0%} {frame_label(e)}" for e in hot[:shown])
    when = f"{summary.get('trigger', 'cli')}, {summary.get('at', '')}, {summary.get('duration_s')}s"
    return f"profile ({when}): {frames or 'idle'}"

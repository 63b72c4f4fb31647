"""A run's verdict in a few lines, for the places a container platform shows when a container ends: its
termination message (`kubectl describe pod`, which keeps at most 4 KiB of it) and the last lines of its
stderr (`docker logs`, `kubectl logs`). The root cause's title comes first, then its first evidence and the
remedy; other findings only as titles, and only while they fit.

Every line is job text made safe for a terminal (text.sanitize.one_line): an exception message, a
command line or a log line in the evidence cannot drive the terminal that shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobwarden.config import format_duration
from jobwarden.model import Finding
from jobwarden.text.render import how_it_ended
from jobwarden.text.sanitize import one_line

if TYPE_CHECKING:
    from jobwarden.store import RunRecord

LIMIT_BYTES = 4096  # Kubernetes keeps the first 4096 bytes of a container's termination message
EVIDENCE_LINES = 5
LINE_BYTES = 400  # one evidence line (a stack frame, a log line) never takes the whole message
_CUT = " [...]"


def verdict_lines(
    job_id: int, name: str, run: RunRecord, findings: Sequence[Finding], status: int
) -> list[str]:
    """The verdict, most important first, `status` being what the container exits with; `fit` trims it
    to the termination message's size."""
    ran = ""
    if run.started_at is not None and run.ended_at is not None:
        ran = f" after {format_duration(run.ended_at - run.started_at)}"
    attempt = f", run {run.n}" if run.n > 1 else ""
    lines = [f"jobwarden: job {job_id} ({one_line(name)}){attempt} {how_it_ended(run)}{ran}; exit {status}"]
    if not findings:
        return lines
    root, *others = findings
    lines.append(f"root cause: {one_line(root.title)} [{root.rule}]")
    if root.summary:
        lines.append(f"  {one_line(root.summary)}")
    lines += [f"  - {one_line(line)}" for line in root.evidence[:EVIDENCE_LINES]]
    if root.remedy:
        lines.append(f"what to do: {one_line(root.remedy)}")
    lines += [f"also: {one_line(f.title)} [{f.rule}]" for f in others]
    lines.append(f"details: jobwarden explain {job_id}")
    return lines


def fit(lines: Sequence[str], limit_bytes: int = LIMIT_BYTES) -> str:
    """The lines as one text of at most `limit_bytes` UTF-8 bytes, newline-terminated: long lines cut,
    then the least important lines left out (other findings, then evidence from the last), and the head,
    the root cause's title and the remedy kept as long as they fit at all."""
    kept = [_cut(line, LINE_BYTES if line.startswith("  ") else limit_bytes) for line in lines]
    while _size(kept) > limit_bytes and len(kept) > 1:
        kept.pop(_least_important(kept))
    text = "".join(f"{line}\n" for line in kept)
    if len(text.encode()) > limit_bytes:  # one line longer than the whole limit
        text = _cut(text.rstrip("\n"), limit_bytes - 1) + "\n"
    return text


def _least_important(lines: list[str]) -> int:
    """The index of the line to leave out first: the last 'also', the last evidence line, the summary, the
    'details' pointer; then whatever is last."""
    for prefix in ("also: ", "  - ", "  ", "details: "):
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        if found:
            return found[-1]
    return len(lines) - 1


def _size(lines: Sequence[str]) -> int:
    return sum(len(line.encode()) + 1 for line in lines)


def _cut(line: str, limit_bytes: int) -> str:
    """At most `limit_bytes` bytes of UTF-8, cut at a character boundary, marked as cut."""
    data = line.encode()
    if len(data) <= limit_bytes:
        return line
    room = max(0, limit_bytes - len(_CUT))
    return data[:room].decode("utf-8", "ignore") + _CUT[: limit_bytes - room]

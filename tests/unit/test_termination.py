"""The verdict where a container platform shows it: its lines (text.verdict), trimmed to Kubernetes' 4 KiB
termination message whatever the job wrote, and the file written safely (control.termination)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.control import termination
from jobwarden.control.termination import checked_path, write_termination_log
from jobwarden.errors import UsageError
from jobwarden.model import Finding, JobState
from jobwarden.text.verdict import LIMIT_BYTES, fit, verdict_lines
from tests.unit.test_container import run_record

OOM = Finding(
    "oom-kill",
    "Killed by the kernel OOM killer: the container at its 150.0M limit",
    "pid 8 was SIGKILLed because the container's memory cgroup (v1) reached its limit.",
    "error",
    ("mechanism: cgroup-v1; OOM kills counted during the run: 1", "memory: peak 150.0M of limit 150.0M"),
    "Either raise the container's memory limit above 150.0M, or lower the job's memory.",
    (8,),
)
LOST = Finding("pool-worker-lost", "Pool worker 8 died; pid 7 waits forever for its result", "s", "error")


def test_the_verdict_leads_with_the_end_and_the_root_cause() -> None:
    run = run_record(JobState.FAILED, signal="SIGTERM", end_reason="hung")
    lines = verdict_lines(1, "train.py", run, [OOM, LOST], 143)
    assert lines[0] == "jobwarden: job 1 (train.py) failed: ended as hung (--on-hang) after 1m30s; exit 143"
    assert lines[1] == f"root cause: {OOM.title} [oom-kill]"
    assert f"  - {OOM.evidence[0]}" in lines
    assert f"what to do: {OOM.remedy}" in lines
    assert f"also: {LOST.title} [pool-worker-lost]" in lines
    assert verdict_lines(1, "train.py", run_record(JobState.SUCCEEDED, exit_code=0), [], 0) == [
        "jobwarden: job 1 (train.py) succeeded: exit code 0 after 1m30s; exit 0"
    ]


def test_a_long_verdict_loses_the_least_important_lines_first() -> None:
    evidence = tuple(f"frame {i}: " + "x" * 900 for i in range(5))
    many = [
        OOM._replace(evidence=evidence),
        *[LOST._replace(title=f"also {i} " + "y" * 300) for i in range(20)],
    ]
    text = fit(verdict_lines(1, "train.py", run_record(JobState.FAILED, exit_code=1), many, 1))
    assert len(text.encode()) <= LIMIT_BYTES
    lines = text.splitlines()
    assert lines[0].startswith("jobwarden: job 1") and lines[1].startswith("root cause: ")
    assert any(line.startswith("what to do: ") for line in lines)
    also = [line for line in lines if line.startswith("also: ")]
    assert 0 < len(also) < 20 and also[0].startswith("also: also 0 ")  # the last findings went first
    assert sum(line.startswith("  - frame") for line in lines) == 5  # before any evidence
    assert all(len(line.encode()) <= 400 for line in lines if line.startswith("  "))


@given(
    name=st.text(max_size=60),
    title=st.text(max_size=5000),
    evidence=st.lists(st.text(max_size=3000), max_size=12),
    remedy=st.text(max_size=5000),
    limit=st.integers(min_value=64, max_value=8192),
)
def test_any_verdict_fits_its_limit_as_safe_utf8_text(
    name: str, title: str, evidence: list[str], remedy: str, limit: int
) -> None:
    finding = Finding("python-exception", title, title, "error", tuple(evidence), remedy)
    lines = verdict_lines(3, name, run_record(JobState.FAILED, exit_code=1), [finding, finding], 1)
    text = fit(lines, limit)
    data = text.encode()
    assert len(data) <= limit and text.endswith("\n")
    assert data.decode() == text
    assert not any(c in text for c in "\x1b\x07\r\x9b") and "\x00" not in text
    assert text.startswith("jobwarden: job 3")


def test_the_default_path_is_written_only_where_the_platform_mounted_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = tmp_path / "termination-log"
    monkeypatch.setattr(termination, "DEFAULT_PATH", str(default))
    assert write_termination_log("verdict\n", None) is None
    assert not default.exists()  # Docker mounts nothing there: nothing made
    default.write_text("stale, longer than the verdict\n")
    assert write_termination_log("verdict\n", None) is None
    assert default.read_text() == "verdict\n"


def test_an_asked_for_path_is_made_private_and_a_planted_link_is_refused(tmp_path: Path) -> None:
    asked = tmp_path / "verdict"
    assert write_termination_log("verdict\n", str(asked)) is None
    assert stat.S_IMODE(asked.stat().st_mode) == 0o600
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    problem = write_termination_log("verdict\n", str(link))
    assert problem is not None and str(link) in problem
    assert target.read_text() == "keep"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    problem = write_termination_log("verdict\n", str(fifo))  # never blocks on a FIFO without a reader
    assert problem is not None


def test_termination_log_names_its_flag_when_it_cannot_be(tmp_path: Path) -> None:
    assert checked_path(str(tmp_path / "log")) == str(tmp_path / "log")
    with pytest.raises(UsageError, match=r"--termination-log .*no such directory"):
        checked_path(str(tmp_path / "missing" / "log"))
    with pytest.raises(UsageError, match="--termination-log"):
        checked_path("bad\nname")

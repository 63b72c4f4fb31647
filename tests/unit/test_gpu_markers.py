"""Whose job a process is, from the JOBWARDEN_* variables it was started with: read without ever handing
out the rest of its environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.errors import ProcessGone
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.markers import JobMarks, read_job_marks


def procfs_with(tmp_path: Path, environ: bytes) -> ProcFS:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "environ").write_bytes(environ)
    return ProcFS(tmp_path)


def test_only_the_named_variables_are_returned(tmp_path: Path) -> None:
    procfs = procfs_with(tmp_path, b"HF_TOKEN=hf_secret\0A=1=2\0EMPTY=\0B\0JOBWARDEN_RUN=3\0")
    assert procfs.environ_values(42, ("A", "EMPTY", "B", "MISSING")) == {"A": "1=2", "EMPTY": ""}


def test_marks_of_a_job_process(tmp_path: Path) -> None:
    environ = b"PATH=/bin\0JOBWARDEN_HOME=/h\0JOBWARDEN_JOB_ID=12\0JOBWARDEN_RUN=2\0"
    assert read_job_marks(procfs_with(tmp_path, environ), 42) == JobMarks("/h", 12, 2)


@pytest.mark.parametrize(
    ("environ", "marks"),
    [
        (b"PATH=/bin\0", None),
        (b"JOBWARDEN_JOB_ID=12\0JOBWARDEN_RUN=1\0", None),  # no home: not ours to place
        (b"JOBWARDEN_HOME=/h\0JOBWARDEN_JOB_ID=x\0", None),
        (b"JOBWARDEN_HOME=/h\0JOBWARDEN_JOB_ID=\xc2\xb2\0", None),  # '²'.isdigit() is True
        (b"JOBWARDEN_HOME=/h\0JOBWARDEN_JOB_ID=7\0", JobMarks("/h", 7, None)),
        (b"JOBWARDEN_HOME=/h\0JOBWARDEN_JOB_ID=7\0JOBWARDEN_RUN=?\0", JobMarks("/h", 7, None)),
    ],
)
def test_missing_or_malformed_marks(tmp_path: Path, environ: bytes, marks: JobMarks | None) -> None:
    assert read_job_marks(procfs_with(tmp_path, environ), 42) == marks


def test_a_vanished_process(tmp_path: Path) -> None:
    with pytest.raises(ProcessGone):
        read_job_marks(ProcFS(tmp_path), 43)

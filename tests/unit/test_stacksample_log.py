"""A speed stack sample that fails says so in shim.log, once per kind of failure: the rules that read the
samples (periodic-stall, the data-loading rules) fall silent without it (issue 29)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobwarden.shim.watch import stacksample


def test_a_py_spy_whose_output_is_unreadable_is_said_once_in_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stacksample, "_said", set())
    changed = tmp_path / "py-spy"
    changed.write_text("#!/bin/sh\necho 'a format jobwarden has never seen'\n")
    changed.chmod(0o755)
    assert stacksample._sample(changed, os.getpid(), 0.0) is None
    assert stacksample._sample(changed, os.getpid(), 1.0) is None
    logged = capsys.readouterr().err
    assert logged.count("speed stack sample of pid") == 1, logged  # once, for two failed samples
    assert "printed no JSON" in logged

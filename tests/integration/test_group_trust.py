"""Group records are outside input (issue 20, item 4): a directory that another user made first, an attempt
they planted, a FIFO, a link to /dev/zero, a nodelist of a hundred million nodes, JSON nested past the
parser or of the wrong types. `explain --group` believes none of it, never hangs, never grows without
bound, and never ends in "internal error". Each test here failed (or hung, or ran out of memory) before."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.support import unavailable

pytestmark = pytest.mark.integration
PY = sys.executable
OTHER_UID = 4242  # a user who is not us: ownership is by number, no account is needed
MEMORY_CAP = 1 << 30  # what explain --group may take here: a reader without caps grows past it


def need_root() -> None:
    if os.geteuid() != 0:
        unavailable("only root can act as another user")


def rank(jw: Jobwarden, shared: Path, code: str, number: int = 0) -> int:
    """One rank of group G, run to its end; its exit status."""
    flags = ["--engine", "none", "--group", "G", "--group-dir", str(shared), "--rank", str(number)]
    return jw("run", "--wait", *flags, "--", PY, "-c", code).returncode


def explain(
    jw: Jobwarden, shared: Path, *extra: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """explain --group with its memory capped (a reader that grows without bound fails, not the machine)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    return subprocess.run(
        [PY, "-m", "jobwarden", "explain", "--group", "G", "--group-dir", str(shared), *extra],
        env=jw.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        stdin=subprocess.DEVNULL,
    )


def forge_records(attempt: Path) -> None:
    """Another user (the attacker on a shared file system) writes an attempt whose rank 0 succeeded: with
    sh, which every user can run (this test's Python may live in a folder only root can enter)."""
    base = {"v": 1, "group": "G", "attempt": 0, "rank": 0, "node": "n1", "pid": 1, "wall": 1.0}
    ended = {
        **base,
        "state": "succeeded",
        "end_reason": "exited",
        "exit_code": 0,
        "signal": None,
        "oom": False,
    }
    lines = [json.dumps({**base, "kind": "started"}), json.dumps({**ended, "kind": "ended"})]
    script = 'set -e; dir=$1; shift; mkdir -p "$dir/ranks"; printf "%s\\n" "$@" > "$dir/ranks/rank-0.jsonl"'
    subprocess.run(
        ["sh", "-c", script, "sh", str(attempt), *lines],
        user=OTHER_UID,
        group=OTHER_UID,
        check=True,
        timeout=60,
    )


@pytest.fixture
def shared_place() -> Iterator[Path]:
    """A world-writable sticky folder every user reaches (a cluster's /scratch/groups)."""
    place = Path(tempfile.mkdtemp(prefix="jw-shared-"))
    place.chmod(0o1777)
    yield place
    shutil.rmtree(place)


def test_a_group_folder_another_user_made_first_decides_nothing(jw: Jobwarden, shared_place: Path) -> None:
    need_root()
    group_dir = shared_place / "exp-7"
    forge_records(group_dir / "attempt-0")  # its folders: the other user's, 0755 (umask 022)
    assert rank(jw, group_dir, "raise SystemExit(3)") == 3  # the job fails; its records could not be written
    result = explain(jw, group_dir, "--exit-status")
    assert result.returncode == 1, result.stdout  # before: 0, "every rank succeeded"
    assert "every rank succeeded" not in result.stdout
    assert "cannot trust the records" in result.stderr and f"belongs to uid {OTHER_UID}" in result.stderr
    assert "internal error" not in result.stderr


def test_a_planted_attempt_never_hides_the_real_one(jw: Jobwarden, shared_place: Path) -> None:
    need_root()
    group_dir = shared_place / "exp-8"
    group_dir.mkdir(mode=0o777)
    group_dir.chmod(0o777)  # ours, but open for a while (made by a script with a loose umask)
    forge_records(group_dir / "attempt-99999")
    assert rank(jw, group_dir, "raise SystemExit(3)") == 3  # our shim closes the folder (0700) and writes
    result = explain(jw, group_dir, "--exit-status")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "exited 3" in result.stdout and "exp-8/attempt-0;" in result.stdout
    verdict = json.loads(explain(jw, group_dir, "--json").stdout)
    assert (verdict["attempt"], verdict["state"]) == (0, "failed")


def test_fifos_links_and_floods_in_a_group_folder_are_skipped_and_said(jw: Jobwarden, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    assert rank(jw, shared, "raise SystemExit(3)") == 3
    ranks = shared / "attempt-0" / "ranks"
    os.mkfifo(ranks / "rank-1.jsonl")  # an open for reading blocks until a writer comes: forever
    (ranks / "rank-2.jsonl").symlink_to("/dev/zero")  # endless bytes, no newline
    (ranks / "rank-3.jsonl").symlink_to(ranks / "rank-0.jsonl")  # a copy that would count as a rank
    group = shared / "attempt-0" / "group.json"
    doc = json.loads(group.read_text())
    group.write_text(json.dumps({**doc, "nodelist": "n[0-99999999]"}))  # 10^8 names: gigabytes
    result = explain(jw, shared, timeout=30)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "rank 0" in out and "exited 3" in out and "rank 1" not in out and "rank 2" not in out
    assert "rank-1.jsonl: not a regular file (a FIFO)" in out
    assert "rank-2.jsonl: a symbolic link" in out and "rank-3.jsonl: a symbolic link" in out
    verdict = json.loads(explain(jw, shared, "--json").stdout)
    assert len(verdict["missing_nodes"]) <= 65_536 and len(verdict["refused"]) == 3


def test_records_nested_too_deep_or_of_the_wrong_types_are_skipped_and_counted(
    jw: Jobwarden, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    assert rank(jw, shared, "raise SystemExit(3)") == 3
    base = {"v": 1, "group": "G", "attempt": 0, "node": "n9", "pid": 7, "wall": 1.0e9}
    junk = [
        "[" * 100_000 + "]" * 100_000,  # nested past the parser's depth: RecursionError
        json.dumps({**base, "kind": "ended", "rank": "five", "exit_code": 0}),
        json.dumps({**base, "kind": "ended", "rank": 5, "exit_code": 1, "output_tail": 5}),
        json.dumps({**base, "kind": "ended", "rank": 5, "node": ["a", "list"], "exit_code": 1}),
        json.dumps({**base, "kind": "hung", "rank": 5, "rules": "no-progress"}),
        '{"v": 1, "kind": "ended", "rank": 5, "wall": NaN}',
        json.dumps({**base, "kind": "started", "rank": 10**30}),
    ]
    (shared / "attempt-0" / "ranks" / "rank-5.jsonl").write_text("\n".join(junk) + "\n")
    (shared / "attempt-0" / "group.json").write_text(json.dumps({"v": 1, "group": "G", "nodelist": 12}))
    result = explain(jw, shared, "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["state"] == "failed" and verdict["root_cause"]["rank"] == 0
    assert verdict["bad_records"] == len(junk) and verdict["torn_lines"] == 0
    assert any("group.json: not a record" in why for why in verdict["refused"])
    text = explain(jw, shared).stdout
    assert f"skipped {len(junk)} records jobwarden did not write" in text

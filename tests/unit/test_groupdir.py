"""The group directory's files: appended lines, documents written whole, the first group.json kept."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from jobwarden.store import groupdir


def rank_file(attempt_root: Path, rank: int | None, node: str) -> Path:
    """A rank's records file as the shim names it (shim/record/groupsink.py): by rank, else by node."""
    return groupdir.records_file(attempt_root, f"rank-{rank}" if rank is not None else f"node-{node}")


def test_the_first_group_json_stays(tmp_path: Path) -> None:
    path = tmp_path / "attempt-0" / "group.json"
    assert groupdir.write_document(path, {"group": "g", "by": "first"}, replace=False)
    assert not groupdir.write_document(path, {"group": "g", "by": "second"}, replace=False)
    assert groupdir.read_document(path) == {"group": "g", "by": "first"}
    assert [p.name for p in path.parent.iterdir()] == ["group.json"]  # no temporary file left


def test_without_hard_links_the_first_writer_still_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "group.json"
    assert groupdir.write_document(path, {"by": "first"}, replace=False)
    assert not groupdir.write_document(path, {"by": "second"}, replace=False)
    assert groupdir.read_document(path) == {"by": "first"}


def test_records_append_and_a_torn_line_is_counted_not_read(tmp_path: Path) -> None:
    path = rank_file(tmp_path, 3, "n2")
    groupdir.append_record(path, {"kind": "started", "rank": 3})
    groupdir.append_record(path, {"kind": "ended", "rank": 3})
    with open(path, "a") as fh:
        fh.write('{"kind": "al')
    log = groupdir.read_rank_log(path)
    assert (log.name, [r["kind"] for r in log.records], log.torn) == ("rank-3", ["started", "ended"], 1)
    assert rank_file(tmp_path, None, "gpu/a 1").name == "node-gpu_a_1.jsonl"


def test_a_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep\n")
    path = rank_file(tmp_path, 0, "n")
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with pytest.raises(OSError):
        groupdir.append_record(path, {"kind": "started"})
    assert target.read_text() == "keep\n"


def test_the_latest_attempt_is_read_by_default(tmp_path: Path) -> None:
    for k in (0, 2, 1):
        groupdir.append_record(rank_file(groupdir.attempt_dir(tmp_path, k), 0, "n"), {"attempt": k})
    records = groupdir.read_group(tmp_path)
    assert records is not None and records.attempt == 2
    assert groupdir.read_group(tmp_path / "none") is None


def test_the_group_dir_and_its_files_are_private(tmp_path: Path) -> None:
    root = tmp_path / "groups" / "g"
    attempt = groupdir.attempt_dir(root, 0)
    groupdir.append_record(rank_file(attempt, 0, "n"), {"kind": "started"})
    groupdir.write_document(attempt / "group.json", {"group": "g"}, replace=False)
    groupdir.write_document(groupdir.node_file(attempt, "n"), {"node": "n"})
    for directory in (root, attempt, attempt / "ranks", attempt / "nodes"):
        assert directory.stat().st_mode & 0o777 == 0o700, directory
    for path in (attempt / "ranks" / "rank-0.jsonl", attempt / "group.json", attempt / "nodes" / "n.json"):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_a_planted_temporary_file_link_is_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep\n")
    path = groupdir.node_file(groupdir.attempt_dir(tmp_path / "g", 0), "n")
    path.parent.mkdir(parents=True)
    (path.parent / f".{path.name}.{os.getpid()}.tmp").symlink_to(target)
    groupdir.write_document(path, {"node": "n"})
    assert target.read_text() == "keep\n"
    assert groupdir.read_document(path) == {"node": "n"}


def test_a_group_dir_that_is_a_link_to_someone_elses_dir_is_refused(tmp_path: Path) -> None:
    theirs = Path("/")  # root's, when we are not root
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)  # nobody's
    root = tmp_path / "g"
    root.symlink_to(theirs)
    with pytest.raises(OSError, match="belongs to uid"):
        groupdir.append_record(rank_file(groupdir.attempt_dir(root, 0), 0, "n"), {"kind": "x"})


def test_a_group_dir_removed_while_the_run_goes_on_is_made_again(tmp_path: Path) -> None:
    path = rank_file(groupdir.attempt_dir(tmp_path / "g", 0), 0, "n")
    groupdir.append_record(path, {"kind": "started"})
    shutil.rmtree(tmp_path / "g")
    groupdir.append_record(path, {"kind": "ended"})
    assert [r["kind"] for r in groupdir.read_rank_log(path).records] == ["ended"]
    assert (tmp_path / "g").stat().st_mode & 0o777 == 0o700
    groupdir.write_document(groupdir.node_file(groupdir.attempt_dir(tmp_path / "g", 0), "n"), {"node": "n"})
    shutil.rmtree(tmp_path / "g")
    assert groupdir.write_document(groupdir.node_file(groupdir.attempt_dir(tmp_path / "g", 0), "n"), {})

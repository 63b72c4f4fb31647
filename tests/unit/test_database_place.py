"""Where the database goes: in the home, unless the home is on a network file system (SQLite's WAL does
not work there); then on local disk, in a private directory that must be ours."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobwarden.errors import StoreError
from jobwarden.paths import database_place, filesystem_type, is_network_fs
from jobwarden.store import Store
from tests.support import unavailable

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:20 - nfs4 filer:/export/home rw,vers=4.2
41 40 0:36 / /home/ana/scratch\\040space rw shared:21 - lustre 10.0.0.1@tcp:/scratch rw
42 22 0:37 / /mnt/s3 rw shared:22 - fuse.s3fs s3fs rw
43 22 0:38 / /var/tmp rw shared:23 - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(
    ("path", "fs_type"),
    [
        ("/", "ext4"),
        ("/home/ana/.local/state/jobwarden", "nfs4"),
        ("/home/ana/scratch space/jw", "lustre"),  # the longest mount point wins; \\040 is a space
        ("/homeless", "ext4"),  # a prefix of the name is not a parent directory
        ("/mnt/s3/x", "fuse.s3fs"),
        ("/var/tmp/jobwarden-0", "tmpfs"),
    ],
)
def test_the_file_system_of_a_path_is_its_longest_mount_point(path: str, fs_type: str) -> None:
    assert filesystem_type(Path(path), MOUNTINFO) == fs_type


def test_network_file_systems_are_told_apart() -> None:
    assert [
        is_network_fs(t) for t in ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "fuse.sshfs")
    ] == [True] * 8
    assert not any(is_network_fs(t) for t in ("ext4", "xfs", "tmpfs", "btrfs", None))


def test_a_home_on_nfs_keeps_its_database_on_local_disk(tmp_path: Path) -> None:
    local = tmp_path / "local"
    place = database_place(Path("/home/ana/jw"), {"JOBWARDEN_LOCAL_DIR": str(local)}, MOUNTINFO)
    assert place.moved and place.fs_type == "nfs4"
    assert place.path.parent.parent == local and place.path.name == "jobwarden.db"
    other = database_place(Path("/home/bob/jw"), {"JOBWARDEN_LOCAL_DIR": str(local)}, MOUNTINFO)
    assert other.path != place.path  # two homes, two databases
    kept = database_place(Path("/srv/jw"), {}, MOUNTINFO)
    assert (kept.moved, kept.path) == (False, Path("/srv/jw/jobwarden.db"))


def test_the_local_directory_must_not_be_a_planted_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's symlink at /var/tmp/jobwarden-<uid> is refused: the store would write through it."""
    if os.geteuid() != 0:
        unavailable("planting a symlink owned by another user needs root")
    import jobwarden.paths as paths

    target = tmp_path / "elsewhere"
    target.mkdir()
    planted = tmp_path / "local"
    planted.symlink_to(target)
    os.lchown(planted, 65534, 65534)
    home = tmp_path / "home"
    monkeypatch.setattr(
        paths, "_database_of", lambda h: paths.DatabasePlace(planted / "home-x" / "jobwarden.db", "nfs", True)
    )
    with pytest.raises(StoreError, match="belongs to uid 65534"):
        Store(home)
    assert not list(target.iterdir())

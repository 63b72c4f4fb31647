"""store.reserve: room kept beside the database for a run's end, made safely, freed once."""

from __future__ import annotations

from pathlib import Path

from jobwarden.store.reserve import RESERVE_BYTES, SpaceReserve, reserve_path


def test_the_reserve_holds_its_blocks_until_released(tmp_path: Path) -> None:
    path = reserve_path(tmp_path / "jobwarden.db", 3, 2)
    assert path == tmp_path / ".jobwarden.db.reserve-3-2"
    reserve = SpaceReserve(path)
    assert reserve.keep() and reserve.kept
    assert path.stat().st_blocks * 512 >= RESERVE_BYTES  # allocated, not a sparse promise
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert reserve.release() and not path.exists() and not reserve.kept
    assert reserve.release() is False  # nothing left to free


def test_a_link_planted_under_its_name_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    path = reserve_path(tmp_path / "jobwarden.db", 1, 1)
    path.symlink_to(target)
    assert SpaceReserve(path).keep() is False
    assert target.read_bytes() == b"keep me"

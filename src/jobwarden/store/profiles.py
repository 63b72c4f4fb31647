"""Profiles kept with their run: `jobs/<id>/run-<n>/profiles/<ms>-<trigger>.speedscope.json` (what
speedscope.app opens) and `<...>.json` beside it, the summary `profile --json` prints (read by `explain` and
the job page without parsing the samples). Both 0600, written to a temporary name and renamed (a reader
never sees half of one), opened with O_NOFOLLOW; the summary is written last, so a profile is listed only
once whole. The newest KEEP of a run are kept."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.paths import Layout, ensure_private_dir

KEEP = 5  # profiles per run
MAX_SPEEDSCOPE_BYTES = 32 << 20  # a stored file; a larger one is refused (said) rather than kept
MAX_SUMMARY_BYTES = 1 << 20
_NAME = re.compile(r"^(\d{13,})-([a-z]{1,16})\.json$")
SPEEDSCOPE_SUFFIX = ".speedscope.json"


class ProfileTooLarge(Exception):
    pass


@dataclass(frozen=True)
class StoredProfile:
    at_ms: int
    trigger: str
    summary_path: Path

    @property
    def speedscope_path(self) -> Path:
        return self.summary_path.with_name(self.summary_path.name[: -len(".json")] + SPEEDSCOPE_SUFFIX)

    def summary(self) -> dict[str, Any] | None:
        raw = _read_private(self.summary_path, MAX_SUMMARY_BYTES)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def speedscope_bytes(self) -> bytes | None:
        return _read_private(self.speedscope_path, MAX_SPEEDSCOPE_BYTES)


def profiles_dir(layout: Layout, job_id: int, run: int) -> Path:
    return layout.run_dir(job_id, run) / "profiles"


def save(
    layout: Layout,
    job_id: int,
    run: int,
    at_ms: int,
    trigger: str,
    speedscope: bytes,
    summary: dict[str, Any],
) -> StoredProfile:
    if len(speedscope) > MAX_SPEEDSCOPE_BYTES:
        raise ProfileTooLarge(f"{len(speedscope)} bytes, more than the {MAX_SPEEDSCOPE_BYTES >> 20} MiB kept")
    folder = ensure_private_dir(profiles_dir(layout, job_id, run))
    stored = StoredProfile(at_ms, trigger, folder / f"{at_ms}-{trigger}.json")
    _write_private(stored.speedscope_path, speedscope)
    _write_private(stored.summary_path, json.dumps(summary, separators=(",", ":")).encode())
    prune(layout, job_id, run)
    return stored


def listed(layout: Layout, job_id: int, run: int) -> list[StoredProfile]:
    """The run's profiles, oldest first."""
    folder = profiles_dir(layout, job_id, run)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        m = _NAME.match(name)
        if m:
            found.append(StoredProfile(int(m.group(1)), m.group(2), folder / name))
    return sorted(found, key=lambda p: (p.at_ms, p.trigger))


def newest(layout: Layout, job_id: int, run: int) -> StoredProfile | None:
    found = listed(layout, job_id, run)
    return found[-1] if found else None


def prune(layout: Layout, job_id: int, run: int, keep: int = KEEP) -> None:
    for old in listed(layout, job_id, run)[:-keep]:
        for path in (old.summary_path, old.speedscope_path):
            with contextlib.suppress(OSError):
                path.unlink()


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)
    os.replace(tmp, path)


def _read_private(path: Path, limit: int) -> bytes | None:
    """A file of ours: a regular file we own, not a link, within `limit` bytes; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(limit + 1)[:limit]
    finally:
        os.close(fd)

"""Where jobwarden keeps its state: one home directory (0700) holding the database and per-run folders."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from jobwarden.errors import StoreError

HOME_ENV = "JOBWARDEN_HOME"
JOB_ID_ENV = "JOBWARDEN_JOB_ID"
RUN_ENV = "JOBWARDEN_RUN"
GROUP_DIR_ENV = "JOBWARDEN_GROUP_DIR"  # the groups' shared records (default: under the home)
LOCAL_DIR_ENV = "JOBWARDEN_LOCAL_DIR"  # where the database goes when the home is on a network file system
# File systems where SQLite's WAL does not work ("WAL does not work over a network filesystem",
# sqlite.org/wal.html): cluster homes are usually one of these.
NETWORK_FS = ("nfs", "lustre", "gpfs", "beegfs", "cifs", "smb3", "fuse.")
MOUNTINFO = Path("/proc/self/mountinfo")
STORE_ENV = "JOBWARDEN_STORE"  # the database's own id (Store.store_id): job ids start over in a new one


def home_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV]).absolute()
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "jobwarden"


def config_file(environ: Mapping[str, str] | None = None) -> Path:
    """The user's config file: $XDG_CONFIG_HOME/jobwarden/config.toml, ~/.config/... by default
    (read by control.configfile; looked for here first, so that `run` without one loads nothing more)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "jobwarden" / "config.toml"


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make it 0700: job logs and command lines are private. An existing
    `path` (and a symlink naming it) must be ours: as root, a home that another user owns is one where
    they can plant symlinks, and we would append job output to any file on the machine."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        link, st = path.lstat(), path.stat()
        if not stat.S_ISDIR(st.st_mode):
            raise StoreError(f"refusing {path}: it is not a directory", f"point {HOME_ENV} at a directory")
        owner = next((s.st_uid for s in (link, st) if s.st_uid != os.geteuid()), None)
        if owner is not None:  # the directory, or a symlink to it
            raise StoreError(
                f"refusing {path}: it belongs to uid {owner}, not to you (uid {os.geteuid()})",
                f"point {HOME_ENV} at a directory you own",
            )
        if st.st_mode & 0o077:
            path.chmod(0o700)
    except OSError as err:
        raise StoreError(
            f"cannot use {path} as jobwarden's state directory: {err.strerror}",
            f"make it writable, or point {HOME_ENV} at a directory you own",
        ) from err
    return path


class DatabasePlace(NamedTuple):
    path: Path
    fs_type: str | None  # the home's file system type, as the kernel names it
    moved: bool  # True: the home is on a network file system, the database is on local disk


def is_network_fs(fs_type: str | None) -> bool:
    return fs_type is not None and fs_type.startswith(NETWORK_FS)


def filesystem_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the file system `path` (or its nearest existing parent) is on: the mount with the
    longest mount point that contains it, from /proc/self/mountinfo."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return None
    existing, rest = path.absolute(), Path()
    while not existing.exists() and existing != existing.parent:  # a home not created yet
        existing, rest = existing.parent, existing.name / rest
    target = str(existing.resolve() / rest).rstrip("/") or "/"
    best, fs_type = -1, None
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not after:
            continue
        point = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, fs_type = len(point), after.split()[0]
    return fs_type


def database_place(
    home: Path, environ: dict[str, str] | None = None, mountinfo: str | None = None
) -> DatabasePlace:
    """The database stays in the home unless the home is on a network file system: then it goes to local
    disk (JOBWARDEN_LOCAL_DIR, default /var/tmp/jobwarden-<uid>), one directory per home, while the logs
    and group records stay in the home (a group's records must be on the shared file system)."""
    fs_type = filesystem_type(home, mountinfo)
    if not is_network_fs(fs_type):
        return DatabasePlace(home / "jobwarden.db", fs_type, False)
    env = os.environ if environ is None else environ
    local = Path(env.get(LOCAL_DIR_ENV) or f"/var/tmp/jobwarden-{os.geteuid()}")
    import hashlib  # only for a home on a network file system: not on every command's path

    tag = hashlib.sha256(str(home).encode()).hexdigest()[:12]
    return DatabasePlace(local / f"home-{tag}" / "jobwarden.db", fs_type, True)


@lru_cache(maxsize=8)
def _database_of(home: Path) -> DatabasePlace:
    return database_place(home)


class Layout:
    """File locations under one home."""

    def __init__(self, home: Path) -> None:
        self.home = home

    @property
    def database(self) -> Path:
        return _database_of(self.home).path

    @property
    def database_place(self) -> DatabasePlace:
        return _database_of(self.home)

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    def job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    def run_dir(self, job_id: int, run: int) -> Path:
        return self.job_dir(job_id) / f"run-{run}"

    def output_log(self, job_id: int, run: int) -> Path:
        return self.run_dir(job_id, run) / "output.log"

    def output_index(self, job_id: int, run: int) -> Path:
        return self.run_dir(job_id, run) / "output.idx"

    def shim_log(self, job_id: int, run: int) -> Path:
        return self.run_dir(job_id, run) / "shim.log"

    def py_dir(self, job_id: int, run: int) -> Path:
        """Where the Python hooks of the job's processes leave their records (one file per process)."""
        return self.run_dir(job_id, run) / "py"

    def ranks_file(self, job_id: int, run: int) -> Path:
        """Where each rank of a running job is (store.rankfile): the shim rewrites it, `status` reads it."""
        return self.run_dir(job_id, run) / "ranks.json"

    def heartbeat_file(self, job_id: int, run: int) -> Path:
        """Touched (or written with JSON) by the job to say it makes progress: JOBWARDEN_HEARTBEAT_FILE."""
        return self.run_dir(job_id, run) / "heartbeat"


def install_extra_command(extra: str) -> str:
    """How to add jobwarden's `extra` to the interpreter that runs this jobwarden: its own pip (a venv's
    `.venv/bin/pip`, not whichever pip is first on PATH), and from a clone the clone itself (`pip install
    'jobwarden[tui]'` there would fetch another copy from the package index)."""
    import sys

    import jobwarden

    here = Path(sys.executable).parent
    pip = str(here / "pip") if (here / "pip").exists() else f"{sys.executable} -m pip"
    package = Path(jobwarden.__file__).resolve().parent
    clone = package.parent.parent  # src/jobwarden: a checkout installed in place (pip install -e)
    if package.parent.name == "src" and (clone / "pyproject.toml").is_file():
        return f"{_relative(pip)} install -e '{_relative(str(clone))}[{extra}]'"
    return f"{_relative(pip)} install 'jobwarden[{extra}]'"


def _relative(path: str) -> str:
    """`path` as typed from the current directory when it lies under it (.venv/bin/pip), else whole."""
    try:
        inner = Path(path).relative_to(Path.cwd())
    except ValueError:
        return path
    return str(inner) if str(inner) != "." else "."

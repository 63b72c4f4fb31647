"""Where jobwarden keeps its state: one home directory (0700) holding the database and per-run folders."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from jobwarden.errors import StoreError

HOME_ENV = "JOBWARDEN_HOME"
JOB_ID_ENV = "JOBWARDEN_JOB_ID"
RUN_ENV = "JOBWARDEN_RUN"
STORE_ENV = "JOBWARDEN_STORE"  # the database's own id (Store.store_id): job ids start over in a new one


def home_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV]).absolute()
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "jobwarden"


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


class Layout:
    """File locations under one home."""

    def __init__(self, home: Path) -> None:
        self.home = home

    @property
    def database(self) -> Path:
        return self.home / "jobwarden.db"

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

    def heartbeat_file(self, job_id: int, run: int) -> Path:
        """Touched (or written with JSON) by the job to say it makes progress: JOBWARDEN_HEARTBEAT_FILE."""
        return self.run_dir(job_id, run) / "heartbeat"

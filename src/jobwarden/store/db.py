"""Opening the database: WAL, a busy timeout, migrations, and errors a user can act on; and `Database`,
the one owner of a store's connection, through which every noun module of the store reads and writes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from jobwarden.errors import StoreBusy, StoreCorrupt, StoreError, StoreFull
from jobwarden.paths import Layout
from jobwarden.store.schema import LATEST, MIGRATIONS

T = TypeVar("T")

# Writers wait up to this long for each other. 100 simultaneous `run`s each hold the write lock for about
# a millisecond, so even a loaded 2-core machine stays far below it.
BUSY_TIMEOUT_S = 60.0


# SQLite's primary result codes (https://www.sqlite.org/rescode.html); an extended code keeps its primary
# code in the low byte (SQLITE_IOERR_WRITE is 778 = 3 << 8 | 10).
_CORRUPT = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_NO_ROOM = {10, 13}  # SQLITE_IOERR, SQLITE_FULL
_NO_ACCESS = {3, 8, 14}  # SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN
_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED
_IOERR_SHORT_READ = 522  # among others: the WAL index (-shm) names frames the -wal file on disk lacks
# A new connection waits this long for supervisors to let go of a deleted write-ahead log (see connect).
WAL_LOST_WAIT_S = 5.0


def translate(err: sqlite3.Error, path: Path) -> StoreError:
    """The store's error for a user, chosen by SQLite's result code (not by its message, which changes
    between versions)."""
    text = str(err)
    code = getattr(err, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in _CORRUPT:
        return StoreCorrupt(
            f"the jobwarden database {path} is corrupt ({text})",
            f"move it aside (mv {path} {path}.corrupt) and jobwarden starts a new one; running jobs keep "
            "running, and their logs stay under jobs/",
        )
    if code == _IOERR_SHORT_READ and Path(f"{path}-shm").exists():
        return _wal_lost_error(path)
    if primary in _BUSY:
        return StoreBusy(
            f"the jobwarden database {path} is locked by another process ({text})",
            "try again; a process that holds it long (an open sqlite3 shell with a transaction) delays all",
        )
    if primary in _NO_ROOM:
        return StoreFull(
            f"cannot write the jobwarden database {path}: {text}",
            f"free space on the filesystem holding {path.parent}",
        )
    if primary in _NO_ACCESS:
        return StoreError(
            f"cannot open the jobwarden database {path}: {text}",
            "make it writable, or point JOBWARDEN_HOME at a directory you own",
        )
    return StoreError(f"database error in {path}: {text}")


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating and migrating if needed) the store database.

    A write-ahead log deleted while supervisors run is still theirs (an open file): they read and write
    it, and the last of them to close writes it back into the database. Until then every new connection
    fails (SQLITE_IOERR_SHORT_READ: the index names frames the new, empty log lacks). Each supervisor
    notices within a tick and reopens (Database.reopen_if_wal_replaced), so that is waited out here, up to
    WAL_LOST_WAIT_S, and then said as what it is."""
    deadline = time.monotonic() + WAL_LOST_WAIT_S
    while _wal_lost(path):
        if time.monotonic() > deadline:
            raise _wal_lost_error(path)
        time.sleep(0.05)  # a poll with a deadline: nothing announces that the last holder let go
    try:
        return _open(path)
    except sqlite3.Error as err:
        raise translate(err, path) from err


def _wal_lost(path: Path) -> bool:
    """The WAL index (-shm, SQLite's wal-index header: mxFrame at byte 16, the page size at 14, native
    byte order) names more frames than the -wal file on disk holds: the log was deleted under the
    processes that still hold it. A healthy log is written before its index, so never shorter."""
    try:
        fd = os.open(f"{path}-shm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        header = os.read(fd, 48)
    except OSError:
        return False
    finally:
        os.close(fd)
    if len(header) < 48:
        return False
    page_size, max_frame = (int(v) for v in struct.unpack_from("=HI", header, 14))
    if max_frame == 0:
        return False
    page_size = 65536 if page_size == 1 else page_size
    try:
        wal_size = os.stat(f"{path}-wal").st_size
    except OSError:
        wal_size = 0
    return wal_size < 32 + max_frame * (24 + page_size)


def _wal_lost_error(path: Path) -> StoreError:
    return StoreError(
        f"the write-ahead log {path}-wal was deleted while jobwarden supervisors had it open",
        "they write its records back into the database as they notice it, within seconds: try again; "
        "never delete jobwarden.db-wal or jobwarden.db-shm while jobs run",
    )


def wal_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the database's write-ahead log; None while there is none."""
    try:
        st = os.stat(f"{path}-wal")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _open(path: Path) -> sqlite3.Connection:
    try:
        if not path.exists():
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys = ON")
            _use_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; WAL keeps it consistent
            _migrate(conn, path)
        except BaseException:
            conn.close()  # an unclosed connection is a ResourceWarning on Python >= 3.13
            raise
    except OSError as err:
        raise StoreError(
            f"cannot open the jobwarden database {path}: {err.strerror}",
            "make its directory writable, or point JOBWARDEN_HOME elsewhere",
        ) from err
    return conn


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL (readers never block the writer, nor it them). The switch does not wait on the busy
    timeout: a first open racing other first opens gets "database is locked" at once, so retry."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == LATEST:
        return
    if version > LATEST:
        raise StoreError(
            f"the database {path} was written by a newer jobwarden (schema {version} > {LATEST})",
            "upgrade jobwarden, or point JOBWARDEN_HOME at another directory",
        )
    with write(conn):
        # re-read under the write lock: a concurrent process may have migrated meanwhile
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:  # a new database: its identity, once (see store_id)
            conn.execute(f"PRAGMA application_id = {_new_store_id()}")
        for number in range(version + 1, LATEST + 1):
            for statement in _statements(MIGRATIONS[number - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")


def store_id(conn: sqlite3.Connection) -> str:
    """The database's own identity: a random number in its header (PRAGMA application_id), set once. A
    job's processes carry it (JOBWARDEN_STORE): after the database is emptied or moved aside, job ids
    start over, and a still-running shim of the old one must never take a new job's processes, marked with
    the same job id, for its own. A database from before the identity gets one at its first use."""
    value = int(conn.execute("PRAGMA application_id").fetchone()[0])
    if value == 0:
        with write(conn):
            value = int(conn.execute("PRAGMA application_id").fetchone()[0])  # another process's, if first
            if value == 0:
                value = _new_store_id()
                conn.execute(f"PRAGMA application_id = {value}")
    return f"{value & 0xFFFFFFFF:08x}"


def _new_store_id() -> int:
    # a signed 32-bit field; 0 means none. os.urandom, not `secrets`: that would load hashlib and random
    # into every command
    return int.from_bytes(os.urandom(4), "big") >> 1 or 1


def _statements(script: str) -> Iterator[str]:
    """Split a migration into statements (executescript would COMMIT our open transaction)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line.split("--", 1)[0] + ("\n" if "--" in line else "")
        if sqlite3.complete_statement(buf):
            if buf.strip():
                yield buf.strip()
            buf = ""


@contextlib.contextmanager
def write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction that takes the lock up front (BEGIN IMMEDIATE): a deferred one that upgrades
    from read to write can fail at once with SQLITE_BUSY, whatever the busy timeout."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        # a COMMIT that fails (disk full) may leave the transaction open: never leave it holding the lock.
        # A Ctrl-C between this generator's yield and the `with` taking it over leaves it suspended until
        # the interpreter's teardown closes it, after the connection: nothing is left to roll back then
        with contextlib.suppress(sqlite3.ProgrammingError):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        raise


class Database:
    """A store's connection and what belongs to it: the files it is open on, its errors translated for a
    user, the sample rows its readers skipped. The store's noun modules (store/jobs.py, samples.py,
    listing.py, ...) are functions over one; `Store` owns it and delegates to them."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.conn = connect(layout.database)
        self._store_id: str | None = None
        self._wal = wal_identity(layout.database)  # the log this connection writes to
        self._file = _file_identity(layout.database)  # and the database file itself
        self.malformed: set[tuple[Any, ...]] = set()  # the sample rows the readers skipped since it opened

    def close(self) -> None:
        self.conn.close()

    def exec(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self.conn.execute(sql, params)
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def translated(self, query: Callable[[], T]) -> T:
        try:
            return query()
        except sqlite3.Error as err:
            raise translate(err, self.layout.database) from err

    def reopen_if_wal_replaced(self) -> bool:
        """For a long-lived connection (a shim's): True when the write-ahead log it writes to is no longer
        the one on disk (deleted, or deleted and made again): its writes would reach no other process,
        and no new connection can open the database while it holds the deleted one. It is closed (the
        last holder to close writes the log back into the database) and opened again."""
        now = wal_identity(self.layout.database)
        if now == self._wal:
            return False
        if _file_identity(self.layout.database) != self._file:
            # the database itself was moved aside (or replaced): a new one there is another store, whose
            # job ids start over; this connection stays with its own (moved) file, never writes there
            return False
        self.conn.close()
        self.conn = connect(self.layout.database)
        self._wal = wal_identity(self.layout.database)
        return True

    @property
    def store_id(self) -> str:
        """This database's identity (store_id above), read once."""
        if self._store_id is None:
            try:
                self._store_id = store_id(self.conn)
            except sqlite3.Error as err:
                raise translate(err, self.layout.database) from err
        return self._store_id

    @contextlib.contextmanager
    def waiting_at_most(self, seconds: float) -> Iterator[None]:
        """Writes inside wait this long for another process's write lock, then raise StoreBusy (the
        shim's loop must go on watching: what it cannot write now, it writes later, with its own time)."""
        self.conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
        try:
            yield
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino

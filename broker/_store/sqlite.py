"""The store on SQLite: the port's implementation, how a data directory's store is opened,
and its online copy.

Theory of operation. `SQLiteStore` is the families of tables (one module each) over the
commit machinery (`commit`), on one SQLite file in the data directory, `broker.db`,
beside its WAL and shared-memory index. `open_store` opens it for the daemon, creating
or migrating it (`schema`), and gives a new store its broker instance id. SQLite does
not always say that a full disk is why a store cannot be opened (sizing the
shared-memory file fails as an I/O error), so when the file system is almost full the
refusal names the disk, whatever SQLite said.

`copy_store` takes SQLite's online backup in one step, so the copy is read in one read
transaction: it is the store as it was after one commit, whatever the daemon writes
meanwhile (in WAL mode its writes go on; they are simply not in the copy). The source
is opened read-only: the copy changes nothing in the store (beside a stopped broker's
store SQLite may make the WAL and its index again, as the daemon's next start would).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

from . import endpoints, messages, transmission
from .catalog import CatalogTables
from .commit import Committer
from .endpoints import EndpointTables
from .errors import StoreError, StoreFailure, StoreUnavailable
from .logs import LogTables
from .messages import MessageTables
from .outcomes import OutcomeTables
from .port import Store
from .remote import RemoteTables
from .security import SecurityTables
from .transmission import TransmissionTables

if TYPE_CHECKING:
    from .port import ManualStore

STORE_FILE: Final = "broker.db"
# the store's files in a data directory: the database and its companions (the online copy
# reads through them)
STORE_FILES: Final = frozenset(
    {STORE_FILE, f"{STORE_FILE}-wal", f"{STORE_FILE}-shm", f"{STORE_FILE}-journal"}
)
BROKER_INSTANCE: Final = "broker_instance"  # the meta key of the broker's instance id
NEARLY_FULL: Final = 1024 * 1024  # free bytes below which a store that cannot open blames the disk
BUSY_TIMEOUT: Final = 30.0  # seconds the online copy waits for the daemon's store (a checkpoint)


class SQLiteStore(
    CatalogTables,
    EndpointTables,
    MessageTables,
    TransmissionTables,
    RemoteTables,
    SecurityTables,
    OutcomeTables,
    LogTables,
    Committer,
):
    """The storage port on one SQLite file, with group commit on one background thread.

    `SQLiteStore(path, durability, threaded=True)`: see `Committer`; ":memory:" and
    `threaded=False` make a store for tests, which commits only in `flush()`.
    """

    multi_row_inserts = {**messages.MULTI_ROW, **transmission.MULTI_ROW, **endpoints.MULTI_ROW}
    row_counts = {**messages.ROW_COUNTS, **transmission.ROW_COUNTS}


def open_store(data_dir: Path, durability: str) -> Store:
    """The store of a data directory, created (with a new broker instance id in its meta
    value `broker_instance`) or migrated if need be, not yet attached.

    Args:
        data_dir: an existing directory that this process has locked for itself.
        durability: "fsync" (every commit synced) or "os" (left to the OS).

    Raises:
        StoreUnavailable: the store cannot be opened; the message says why (a full disk
            by name) and what to do.
    """
    try:
        store = SQLiteStore(data_dir / STORE_FILE, durability)
        if BROKER_INSTANCE not in store.load_meta():
            store.put_meta(BROKER_INSTANCE, str(uuid.uuid4()))
            store.write_now()
    except StoreFailure as exc:
        raise StoreUnavailable(_cannot_open(data_dir, exc.__cause__ or exc)) from None
    except (sqlite3.Error, OSError) as exc:
        raise StoreUnavailable(_cannot_open(data_dir, exc)) from None
    return store


def _cannot_open(data_dir: Path, exc: BaseException) -> str:
    """One line for a store that cannot be opened (see the module's comment)."""
    text = str(exc)
    try:
        stat = os.statvfs(data_dir)
        free_bytes: int | None = stat.f_bavail * stat.f_frsize
    except OSError:
        free_bytes = None
    full = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "full" in text.lower()
    if full or (free_bytes is not None and free_bytes < NEARLY_FULL):
        free = "no space" if free_bytes is None else f"{free_bytes / (1024 * 1024):.1f} MiB free"
        return (
            f"cannot start: the disk holding {data_dir} is full ({free}; SQLite said: {text});"
            " free some space and start again"
        )
    return f"cannot open the store in {data_dir}: {text}"


def copy_store(source: Path, target: Path) -> None:
    """Copy the store file `source`, running or stopped, into the file `target` as it
    was after one commit (see the module's comment).

    Args:
        source: a data directory's STORE_FILE.
        target: a new, empty file (made beforehand, so that it has the right mode).

    Raises:
        StoreError: the store cannot be read, or the copy written.
    """
    uri = f"{source.resolve().as_uri()}?mode=ro"
    try:
        reader = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT)
        try:
            copy = sqlite3.connect(target)
            try:
                reader.backup(copy)  # all pages in one step: one snapshot
            finally:
                copy.close()
        finally:
            reader.close()
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None


if TYPE_CHECKING:

    def _made_for_tests(store: SQLiteStore) -> ManualStore:
        """A store made with threaded=False is what the shared store tests drive (mypy
        checks this assignment; `open_store` checks the port itself)."""
        return store

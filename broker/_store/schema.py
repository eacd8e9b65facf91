"""The SQLite file: its tables and indexes, how a connection is opened, and migrations.

Theory of operation. One file in WAL mode holds every table: the writer connection
commits while readers read what was committed before (WAL readers never block the
writer). Pages are `PAGE_SIZE` bytes: a small commit writes whole pages, and small pages
keep its round trip short. `auto_vacuum = INCREMENTAL` lets the store return free pages
to the file system (see `commit`); `journal_size_limit` truncates the WAL after any
checkpoint. Deleted rows are zeroed only on pages a commit writes anyway
(`secure_delete = FAST`, whatever the SQLite build's default): a page a drain empties is
not written once more just to zero it, which made the WAL of a deep drain, and its
checkpoints, about a third larger. With durability "fsync" every commit is synced (`synchronous=FULL`); with
"os" it is left to the OS (`NORMAL`): it survives a daemon crash, not a power cut.

Schema versions (`PRAGMA user_version`): 1 is the first layout (no version recorded),
2 adds message sizes, the conversation index and endpoint indexes. `migrate` upgrades
in place, and refuses a store written by a newer ssb (its version stays as it was);
tables added since are made by every start (`CREATE TABLE IF NOT EXISTS`).
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Final

from ssb.protocol import unpack

from . import sql
from .errors import StoreUnavailable
from .port import ENDPOINT_COLUMNS
from .sql import columns

log = logging.getLogger("ssb.store")

SCHEMA_VERSION: Final = 2
WAL_LIMIT: Final = 64 * 1024 * 1024  # the WAL is truncated to this after a checkpoint
PAGE_SIZE: Final = 4096  # a small commit writes whole pages: small pages keep round trips short
WRITER_CACHE_KIB: Final = 8192  # SQLite page cache of the store thread's connection
READER_CACHE_KIB: Final = 4096  # and of the event loop's reading connection
MEMORY: Final = ":memory:"  # the path of an in-memory store (tests)

# keyed by conversation: both endpoints of a local dialog share a page, so a commit
# that changes both writes one
_ENDPOINTS: Final = (
    "CREATE TABLE IF NOT EXISTS endpoints ("
    " handle BLOB NOT NULL, conversation_id BLOB NOT NULL, is_initiator INTEGER NOT NULL,"
    " service TEXT NOT NULL, far_service TEXT NOT NULL, far_broker_instance TEXT,"
    " contract TEXT NOT NULL, group_id BLOB NOT NULL, state TEXT NOT NULL,"
    " send_seq INTEGER NOT NULL, receive_seq INTEGER NOT NULL, priority INTEGER NOT NULL,"
    " lifetime_expiry REAL, timer_at REAL, far_handle BLOB, created REAL NOT NULL,"
    " extra BLOB, PRIMARY KEY (conversation_id, is_initiator)) WITHOUT ROWID"
)
TABLES: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS catalog ("
    " kind TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,"
    " PRIMARY KEY (kind, name))",
    _ENDPOINTS,
    "CREATE TABLE IF NOT EXISTS messages ("
    " queuing_order INTEGER PRIMARY KEY, queue TEXT NOT NULL, handle BLOB NOT NULL,"
    " seq INTEGER NOT NULL, message_type TEXT NOT NULL, validation TEXT NOT NULL,"
    " body BLOB NOT NULL, enqueue_time REAL NOT NULL, status INTEGER NOT NULL,"
    " delivery_count INTEGER NOT NULL, extra BLOB, size INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS transmission_queue ("
    " id INTEGER PRIMARY KEY, handle BLOB NOT NULL, conversation_id BLOB NOT NULL,"
    " to_service TEXT NOT NULL, to_broker_instance TEXT, from_service TEXT NOT NULL,"
    " contract TEXT NOT NULL, is_initiator INTEGER NOT NULL, seq INTEGER NOT NULL,"
    " message_type TEXT NOT NULL, validation TEXT NOT NULL, body BLOB NOT NULL,"
    " enqueue_time REAL NOT NULL, priority INTEGER NOT NULL, status TEXT NOT NULL,"
    " extra BLOB)",
    "CREATE TABLE IF NOT EXISTS remote_dialogs ("
    " conversation_id BLOB NOT NULL, direction INTEGER NOT NULL, side TEXT NOT NULL,"
    " peer TEXT NOT NULL, session_key BLOB, wrapped_key BLOB, next_seq INTEGER NOT NULL,"
    " envelope BLOB, PRIMARY KEY (conversation_id, direction, side))",
    "CREATE TABLE IF NOT EXISTS held_fragments ("
    " conversation_id BLOB NOT NULL, direction INTEGER NOT NULL, seq INTEGER NOT NULL,"
    " fragment_index INTEGER NOT NULL, fragment_count INTEGER NOT NULL,"
    " message_type TEXT NOT NULL, payload BLOB NOT NULL,"
    " PRIMARY KEY (conversation_id, direction, seq, fragment_index))",
    "CREATE TABLE IF NOT EXISTS poison_messages ("
    " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, handle BLOB, queuing_order INTEGER,"
    " delivery_count INTEGER, action TEXT NOT NULL, time REAL NOT NULL,"
    " error TEXT NOT NULL, body BLOB)",
    # who may log in: scrypt hashes, never a password (see broker/_logins.py)
    "CREATE TABLE IF NOT EXISTS logins ("
    " name TEXT PRIMARY KEY, hash TEXT NOT NULL, created REAL NOT NULL)",
    # permissions granted, and who owns each catalog object (see broker/_permissions.py)
    "CREATE TABLE IF NOT EXISTS grants ("
    " login TEXT NOT NULL, permission TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,"
    " PRIMARY KEY (login, permission, kind, name)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS owners ("
    " kind TEXT NOT NULL, name TEXT NOT NULL, login TEXT NOT NULL,"
    " PRIMARY KEY (kind, name)) WITHOUT ROWID",
    # the seed-000 scheduler's execution log (see broker/_activation/execution_log.py)
    "CREATE TABLE IF NOT EXISTS execution_log ("
    " log_id INTEGER PRIMARY KEY, caller INTEGER, scheduler_handle BLOB, task TEXT NOT NULL,"
    " queued_time REAL NOT NULL, start_time REAL, end_time REAL, activated_task INTEGER,"
    " pid INTEGER, session_id INTEGER, error TEXT)",
    # ids of committed transactions, for clients resolving a commit whose answer was lost
    # (see _core/outcomes.py): one row per store batch, numbered, pruned oldest first
    "CREATE TABLE IF NOT EXISTS outcome_batches ("
    " seq INTEGER PRIMARY KEY, time REAL NOT NULL, count INTEGER NOT NULL, ids BLOB NOT NULL)",
    # what the broker's first start made in its data directory (its keys and
    # certificates, admin.password): a copy of the data directory is not the broker
    "CREATE TABLE IF NOT EXISTS broker_files (name TEXT PRIMARY KEY, body TEXT NOT NULL)",
)
INDEXES: Final = (
    # a conversation's messages in order, by status; covering for the start-up summary
    "CREATE INDEX IF NOT EXISTS messages_by_conversation"
    " ON messages (status, queue, handle, queuing_order, size)",
    *sql.INDEXES,
)


def _uuid_adapter(value: uuid.UUID) -> bytes:
    return value.bytes


sqlite3.register_adapter(uuid.UUID, _uuid_adapter)


def connect(path: Path | str, cache_kib: int, timeout: float = 5.0) -> sqlite3.Connection:
    """A connection to the store's file, in autocommit mode (the store says BEGIN), usable
    from any thread (one thread at a time)."""
    db = sqlite3.connect(path, timeout, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA foreign_keys=OFF")
    db.execute(f"PRAGMA cache_size=-{cache_kib}")
    db.execute("PRAGMA secure_delete=FAST")
    return db


def create(db: sqlite3.Connection, path: Path | str, durability: str) -> None:
    """Make or upgrade the tables and set the connection up for `durability`."""
    fresh = db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
    if fresh:
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if not fresh and version != SCHEMA_VERSION:
        migrate(db, path, version)  # (refuses a newer one)
    if str(path) != MEMORY:
        db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={'FULL' if durability == 'fsync' else 'NORMAL'}")
    db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
    for statement in (*TABLES, *INDEXES):
        db.execute(statement)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def migrate(db: sqlite3.Connection, path: Path | str, version: int) -> None:
    """Upgrade a store written by an older ssb, in place (one transaction per step)."""
    if version > SCHEMA_VERSION:
        raise StoreUnavailable(
            f"the store {path} was written by a newer ssb (schema {version}); "
            "run that version, or start from a backup"
        )
    if version < 2:
        log.info("migrating the store %s from schema %d to 2", path, version)
        started = time.monotonic()
        db.execute("BEGIN")
        db.execute(_ENDPOINTS.replace("IF NOT EXISTS endpoints", "endpoints_v2"))
        cols = columns(ENDPOINT_COLUMNS)
        db.execute(f"INSERT INTO endpoints_v2 ({cols}) SELECT {cols} FROM endpoints")
        db.execute("DROP TABLE endpoints")
        db.execute("ALTER TABLE endpoints_v2 RENAME TO endpoints")
        db.execute("ALTER TABLE messages ADD COLUMN size INTEGER NOT NULL DEFAULT 0")
        db.execute("UPDATE messages SET size = length(body)")
        parked = []
        for order, extra in db.execute(
            "SELECT queuing_order, extra FROM messages WHERE extra IS NOT NULL"
        ):
            data = unpack(extra)
            if data.get("parked_until") is not None:
                parked.append((order,))
        db.executemany("UPDATE messages SET status = 6 WHERE queuing_order = ?", parked)
        # the scheduler's procedure moved into the ssb namespace
        for name, body in db.execute(
            "SELECT name, body FROM catalog WHERE kind = 'queue'"
        ).fetchall():
            if '"client._scheduler:' in body:
                db.execute(
                    "UPDATE catalog SET body = ? WHERE kind = 'queue' AND name = ?",
                    (body.replace('"client._scheduler:', '"ssb.client._scheduler:'), name),
                )
        for statement in (*TABLES, *INDEXES):  # tables added since schema 2 first
            db.execute(statement)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("COMMIT")
        # free pages go back to the file system from now on, and pages are larger
        # (both need one rebuild, outside WAL mode)
        try:
            db.execute("PRAGMA journal_mode=DELETE")
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            db.execute("VACUUM")
        except sqlite3.Error as exc:
            log.warning(
                "could not rebuild the store (%s): it works, but its free pages stay in"
                " the file until it is rebuilt (VACUUM it while ssb is stopped)",
                exc,
            )
        log.info("store migrated in %.1f s", time.monotonic() - started)

"""The embedded store: every SQL statement of the broker lives in this module.

Theory of operation. SQLite in WAL mode holds everything durable: the catalog,
conversation endpoints, messages, the transmission queue, the transport's dialog
state, poison incidents and the scheduler's log. The core keeps in memory only what it
is using (see `_core.backlog` and `_core.endpoints`) and reads the rest on demand, on a
second connection (WAL readers never block the writer), which sees committed batches
only.

Writes join the *open batch* as the core changes its memory, always in one synchronous
stretch per operation, so a batch never holds half of an operation. One batch at a time
is committed in one SQLite transaction (one fsync with `durability="fsync"`, none with
`"os"`: then the WAL is in the OS and survives a daemon crash but not a power cut).
While a batch commits, new writes collect in the next one: that is group commit. A
commit has two halves: the event loop applies the batch's statements (BEGIN and the
writes, which change SQLite's page cache only), then the store thread runs COMMIT,
which writes the WAL, syncs it and, when SQLite's automatic checkpoint is due,
checkpoints. Applying on the store thread would make it win the interpreter lock back
from a busy loop after every statement step, which stretched commits several times over
in a broker that also carries broker-to-broker traffic; the loop applies at no such
cost, and the thread still does the I/O. A batch heavier than `LOOP_WEIGHT` rows (the
loop never stalls for long), a light one of at most `INLINE_WEIGHT` rows (a lone
client's: the hop to the thread then overlaps the loop's own work, which keeps its round
trip short), and any batch while commits fail are applied on the thread too. Between
the halves the writer connection is in the middle of a transaction: nothing else uses
it until the commit ends. With `"os"`, a light batch (at most
`INLINE_WEIGHT` rows touched) is committed whole on the event loop: that costs less than
the hop to the store thread and back, which is most of a lone client's round trip. Such
commits never run SQLite's automatic checkpoint (it would sync files on the event loop);
the checkpoint runs on the store thread, in the next commit there, and at most
`INLINE_STREAK` light batches in a row are committed inline. Two rewrites keep batches
small: a message deleted before the batch that inserts it has started committing is
neither inserted nor deleted; and an endpoint written several times in one open batch
is written once, with its last state. Rows of the hot tables (messages, the
transmission queue, endpoints) are inserted many to a statement, `MULTI_ROW_INSERT` at
most: each statement step has a fixed cost (SQLite releases and takes back the
interpreter lock around it, which on the store thread means waiting for a busy loop),
so one step per row would stretch a commit of a few hundred rows several times over.

Batches are numbered. `watermark()` is the number of the newest batch holding a write,
and `when_durable(n, callback)` runs the callback on the event loop once batch `n` is
on disk. The server answers a request only when everything applied before its answer
is durable, so nothing a client observes can be lost by a crash.

A commit that fails for want of space or an I/O error is not the end: the batch stays,
merged with the writes that follow, and is tried again after `RETRY_DELAY`, after a WAL
checkpoint that lets it reuse the WAL file's space; meanwhile `on_trouble` tells the
daemon (which refuses new messages with the real cause) and answers wait. Any other failure (a constraint broken: a bug) is fatal: memory would stay
ahead of disk, so the daemon stops and a restart rebuilds from what is durable.

Space: `auto_vacuum = INCREMENTAL` lets the store return free pages to the file system.
While busy, free pages are only reused by the next inserts (returning them moves live
pages from the file's end, which would stall the commits of a drain); once the daemon is
idle it calls `checkpoint` repeatedly, each call returning up to `IDLE_VACUUM_PAGES`
and truncating the WAL, until only `KEEP_FREE_PAGES` are left free for reuse. `journal_size_limit`
truncates the WAL after any checkpoint.

Schema versions (`PRAGMA user_version`): 1 is the first layout (no version recorded),
2 adds message sizes, the conversation index and endpoint indexes. `_migrate` upgrades
in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import sqlite3
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from ssb.protocol import ROW_OVERHEAD, unpack

log = logging.getLogger("ssb.store")

SCHEMA_VERSION: Final = 2
RETRY_DELAY: Final = 1.0  # seconds before a failed commit is tried again
WAL_LIMIT: Final = 64 * 1024 * 1024  # the WAL is truncated to this after a checkpoint
PAGE_SIZE: Final = 4096  # a small commit writes whole pages: small pages keep round trips short
WRITER_CACHE_KIB: Final = 8192  # SQLite page cache of the store thread's connection
READER_CACHE_KIB: Final = 4096  # and of the event loop's reading connection
KEEP_FREE_PAGES: Final = 2048  # free pages an idle store keeps for the next inserts
IDLE_VACUUM_PAGES: Final = 8192  # free pages returned per idle checkpoint
INLINE_WEIGHT: Final = 8  # a batch touching at most this many rows may commit on the loop
INLINE_STREAK: Final = 200  # light batches in a row committed inline, then one on the thread
LOOP_WEIGHT: Final = 4096  # a batch touching at most this many rows is applied on the loop
MULTI_ROW_INSERT: Final = 64  # rows one INSERT statement writes at most (see above)
AUTO_CHECKPOINT: Final = 1000  # WAL pages that make a threaded commit checkpoint (SQLite's)
UNKNOWN_ROWS: Final = 1 << 20  # the weight of a statement that deletes an unknown number
READ_CHUNK: Final = 500  # parameters per IN (...) read
# the start-up summary's slices of the handle range (handles are random UUIDs)
_HANDLE_SLICES: Final = ((b"", bytes([0x80])), (bytes([0x80]), None))

ENDPOINT_COLUMNS: Final = (
    "handle",
    "conversation_id",
    "is_initiator",
    "service",
    "far_service",
    "far_broker_instance",
    "contract",
    "group_id",
    "state",
    "send_seq",
    "receive_seq",
    "priority",
    "lifetime_expiry",
    "timer_at",
    "far_handle",
    "created",
    "extra",
)
MESSAGE_COLUMNS: Final = (
    "queuing_order",
    "queue",
    "handle",
    "seq",
    "message_type",
    "validation",
    "body",
    "enqueue_time",
    "status",
    "delivery_count",
    "extra",
    "size",
)
TRANSMISSION_COLUMNS: Final = (
    "id",
    "handle",
    "conversation_id",
    "to_service",
    "to_broker_instance",
    "from_service",
    "contract",
    "is_initiator",
    "seq",
    "message_type",
    "validation",
    "body",
    "enqueue_time",
    "priority",
    "status",
    "extra",
)
EXECUTION_LOG_COLUMNS: Final = (
    "log_id",
    "caller",
    "scheduler_handle",
    "task",
    "queued_time",
    "start_time",
    "end_time",
    "activated_task",
    "pid",
    "session_id",
    "error",
)
POISON_COLUMNS: Final = (
    "id",
    "queue",
    "handle",
    "queuing_order",
    "delivery_count",
    "action",
    "time",
    "error",
    "body",
)

_TABLES: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS catalog ("
    " kind TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,"
    " PRIMARY KEY (kind, name))",
    # keyed by conversation: both endpoints of a local dialog share a page, so a commit
    # that changes both writes one
    "CREATE TABLE IF NOT EXISTS endpoints ("
    " handle BLOB NOT NULL, conversation_id BLOB NOT NULL, is_initiator INTEGER NOT NULL,"
    " service TEXT NOT NULL, far_service TEXT NOT NULL, far_broker_instance TEXT,"
    " contract TEXT NOT NULL, group_id BLOB NOT NULL, state TEXT NOT NULL,"
    " send_seq INTEGER NOT NULL, receive_seq INTEGER NOT NULL, priority INTEGER NOT NULL,"
    " lifetime_expiry REAL, timer_at REAL, far_handle BLOB, created REAL NOT NULL,"
    " extra BLOB, PRIMARY KEY (conversation_id, is_initiator)) WITHOUT ROWID",
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
)
_INDEXES: Final = (
    # a conversation's messages in order, by status; covering for the start-up summary
    "CREATE INDEX IF NOT EXISTS messages_by_conversation"
    " ON messages (status, queue, handle, queuing_order, size)",
    "CREATE UNIQUE INDEX IF NOT EXISTS endpoints_by_handle ON endpoints (handle)",
    "CREATE INDEX IF NOT EXISTS endpoints_by_group ON endpoints (group_id)",
    "CREATE INDEX IF NOT EXISTS endpoints_by_timer ON endpoints (timer_at)"
    " WHERE timer_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS endpoints_by_lifetime ON endpoints (lifetime_expiry)"
    " WHERE lifetime_expiry IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS transmission_by_direction"
    " ON transmission_queue (conversation_id, is_initiator, seq)",
)


def _insert(table: str, columns: Sequence[str], verb: str = "INSERT") -> str:
    marks = ", ".join("?" for _ in columns)
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({marks})"


@functools.cache
def _multi_row(sql: str, columns: int, rows: int) -> str:
    """`sql`, a one-row INSERT of `columns` values, extended to insert `rows` rows."""
    group = "(" + ", ".join("?" * columns) + ")"
    return sql + ", " + ", ".join([group] * (rows - 1)) if rows > 1 else sql


def _insert_rows(db: sqlite3.Connection, sql: str, columns: int, rows: list[Row]) -> None:
    """Insert `rows` with statements of MULTI_ROW_INSERT rows, then of halving sizes for
    the rest (a few statement shapes per table, all of them in the statement cache)."""
    size = MULTI_ROW_INSERT
    done = 0
    while done < len(rows):
        while size > len(rows) - done:
            size //= 2
        chunk = rows[done : done + size]
        db.execute(_multi_row(sql, columns, size), list(itertools.chain.from_iterable(chunk)))
        done += size


def _columns(columns: Sequence[str]) -> str:
    return ", ".join(columns)


_ENDPOINT_SELECT: Final = f"SELECT {_columns(ENDPOINT_COLUMNS)} FROM endpoints"
_SIZE: Final = MESSAGE_COLUMNS.index("size")
_MESSAGE_SELECT: Final = f"SELECT {_columns(MESSAGE_COLUMNS)} FROM messages"
_TRANSMISSION_SELECT: Final = f"SELECT {_columns(TRANSMISSION_COLUMNS)} FROM transmission_queue"

_PUT_META: Final = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"
_PUT_CATALOG: Final = "INSERT OR REPLACE INTO catalog (kind, name, body) VALUES (?, ?, ?)"
_DELETE_CATALOG: Final = "DELETE FROM catalog WHERE kind = ? AND name = ?"
_INSERT_ENDPOINT: Final = _insert("endpoints", ENDPOINT_COLUMNS)
_UPDATE_ENDPOINT: Final = (
    "UPDATE endpoints SET "
    + ", ".join(
        f"{c} = ?" for c in ENDPOINT_COLUMNS if c not in ("conversation_id", "is_initiator")
    )
    + " WHERE conversation_id = ? AND is_initiator = ?"
)
# the columns that change as a dialog runs, none of them indexed: an update that names only
# these leaves the endpoint's index entries alone
HOT_ENDPOINT_COLUMNS: Final = (
    "state",
    "send_seq",
    "receive_seq",
    "far_handle",
    "far_broker_instance",
    "extra",
)
_UPDATE_ENDPOINT_HOT: Final = (
    "UPDATE endpoints SET "
    + ", ".join(f"{c} = ?" for c in HOT_ENDPOINT_COLUMNS)
    + " WHERE conversation_id = ? AND is_initiator = ?"
)
_KEY_AT: Final = (ENDPOINT_COLUMNS.index("conversation_id"), ENDPOINT_COLUMNS.index("is_initiator"))
_FULL_AT: Final = tuple(
    i for i, c in enumerate(ENDPOINT_COLUMNS) if c not in ("conversation_id", "is_initiator")
)
_DELETE_ENDPOINT: Final = "DELETE FROM endpoints WHERE handle = ?"
_INSERT_MESSAGE: Final = _insert("messages", MESSAGE_COLUMNS)
_DELETE_MESSAGE: Final = "DELETE FROM messages WHERE queuing_order = ?"
# many rows in one statement cost about half as much as one statement each; a few sizes,
# the list padded with repeats, keep the statements few (and cached)
DELETE_LISTS: Final = (8, 32, 128, 512)
_DELETE_MESSAGE_LISTS: Final = {
    n: f"DELETE FROM messages WHERE queuing_order IN ({', '.join('?' * n)})" for n in DELETE_LISTS
}
_LIST_STATEMENTS: Final = frozenset(_DELETE_MESSAGE_LISTS.values())
# a run of consecutive queuing orders (what one RECEIVE of one conversation usually takes)
# goes in one range: one descent of the table's tree instead of one per row
_DELETE_MESSAGE_RANGE: Final = "DELETE FROM messages WHERE queuing_order BETWEEN ? AND ?"
MIN_RANGE: Final = 4
_DELETE_CONVERSATION_MESSAGES: Final = (
    "DELETE FROM messages WHERE status IN (0, 1, 6, 7) AND queue = ? AND handle = ?"
)
_SET_MESSAGE_STATUS: Final = "UPDATE messages SET status = ? WHERE queuing_order = ?"
_SET_DELIVERY_COUNT: Final = "UPDATE messages SET delivery_count = ? WHERE queuing_order = ?"
_SET_MESSAGE_EXTRA: Final = "UPDATE messages SET extra = ? WHERE queuing_order = ?"
_INSERT_TRANSMISSION: Final = _insert("transmission_queue", TRANSMISSION_COLUMNS)
_MULTI_ROW: Final = {  # statement -> how many columns a row binds (see `_insert_rows`)
    _INSERT_MESSAGE: len(MESSAGE_COLUMNS),
    _INSERT_TRANSMISSION: len(TRANSMISSION_COLUMNS),
    _INSERT_ENDPOINT: len(ENDPOINT_COLUMNS),
}
_DELETE_TRANSMISSION: Final = "DELETE FROM transmission_queue WHERE id = ?"
_DELETE_TRANSMISSION_SEQS: Final = (
    "DELETE FROM transmission_queue WHERE conversation_id = ? AND is_initiator = ?"
    " AND seq BETWEEN ? AND ?"
)
_DELETE_TRANSMISSION_DIRECTION: Final = (
    "DELETE FROM transmission_queue WHERE conversation_id = ? AND is_initiator = ?"
)
_PUT_REMOTE_DIALOG: Final = (
    "INSERT OR REPLACE INTO remote_dialogs (conversation_id, direction, side, peer, session_key,"
    " wrapped_key, next_seq, envelope) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SET_REMOTE_NEXT_SEQ: Final = (
    "UPDATE remote_dialogs SET next_seq = ? WHERE conversation_id = ? AND direction = ?"
    " AND side = ?"
)
_DELETE_REMOTE_DIALOG: Final = (
    "DELETE FROM remote_dialogs WHERE conversation_id = ? AND direction = ? AND side = ?"
)
_PUT_HELD_FRAGMENT: Final = (
    "INSERT OR REPLACE INTO held_fragments (conversation_id, direction, seq, fragment_index,"
    " fragment_count, message_type, payload) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_DELETE_HELD_MESSAGE: Final = (
    "DELETE FROM held_fragments WHERE conversation_id = ? AND direction = ? AND seq = ?"
)
_DELETE_HELD_DIRECTION: Final = (
    "DELETE FROM held_fragments WHERE conversation_id = ? AND direction = ?"
)
_INSERT_POISON: Final = _insert("poison_messages", POISON_COLUMNS)
_PUT_EXECUTION_LOG: Final = _insert("execution_log", EXECUTION_LOG_COLUMNS, "INSERT OR REPLACE")
_DELETE_EXECUTION_LOG_UPTO: Final = "DELETE FROM execution_log WHERE log_id <= ?"
_INSERT_OUTCOMES: Final = "INSERT INTO outcome_batches (seq, time, count, ids) VALUES (?, ?, ?, ?)"
_DELETE_OUTCOMES_UPTO: Final = "DELETE FROM outcome_batches WHERE seq <= ?"

Row = tuple[Any, ...]
_CANCELLED: Final = None  # a batch row that was cancelled before it was committed


class StoreFailure(RuntimeError):
    """A batch cannot be committed and retrying will not help; memory is ahead of disk."""


class StoreUnavailable(RuntimeError):
    """The store cannot be opened (the message says why and what to do)."""


def _message_size(row: Row) -> int:
    """What a message row adds to an answer: its body and its other columns."""
    return int(row[_SIZE]) + ROW_OVERHEAD


def _transmission_size(row: Row) -> int:
    return len(row[11])


def _weight(size: int) -> int:
    """A row's weight in a batch (see `Batch.weight`): one, and one per page of its body."""
    return 1 + size // PAGE_SIZE


def _uuid_adapter(value: uuid.UUID) -> bytes:
    return value.bytes


sqlite3.register_adapter(uuid.UUID, _uuid_adapter)


def _transient(exc: BaseException) -> bool:
    """Whether a failed commit may succeed later (space, I/O), rather than being a bug."""
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        transient = {
            getattr(sqlite3, name)
            for name in (
                "SQLITE_FULL",
                "SQLITE_IOERR",
                "SQLITE_BUSY",
                "SQLITE_LOCKED",
                "SQLITE_CANTOPEN",
            )
            if hasattr(sqlite3, name)
        }
        if code is not None:
            return code & 0xFF in transient
        text = str(exc).lower()
        return "full" in text or "disk i/o" in text or "locked" in text
    return False


def describe_failure(exc: BaseException) -> str:
    """A store error in words: SQLite's own name for it and its text."""
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name})" if name else str(exc) or type(exc).__name__


class Batch:
    """Writes collected for one SQLite transaction, in statement order (consecutive writes
    of one statement share a parameter list: one executemany)."""

    __slots__ = ("last_sql", "number", "params", "rows", "statements", "weight")

    def __init__(self, number: int) -> None:
        self.number = number
        self.statements: list[tuple[str, list[Row | None]]] = []
        self.rows = 0
        self.weight = 0  # rows touched, a large body counting for one per page
        self.last_sql = ""
        self.params: list[Row | None] = []

    def add(self, sql: str, row: Row, weight: int = 1) -> list[Row | None]:
        """Append a write; returns the parameter list it went into (it is the last item)."""
        if sql is not self.last_sql:
            self.last_sql = sql
            self.params = []
            self.statements.append((sql, self.params))
        params = self.params
        params.append(row)
        self.rows += 1
        self.weight += weight
        return params


class Store:
    """SQLite-backed durable store with group commit on one background thread."""

    def __init__(
        self, path: Path | str, durability: str = "fsync", *, threaded: bool = True
    ) -> None:
        """Args:
        path: the database file (":memory:" for tests: one connection, no thread).
        durability: "fsync" or "os".
        threaded: commit on a store thread (the daemon); False commits only when
            `flush()` is called (tests drive durability by hand).
        """
        if durability not in ("fsync", "os"):
            raise ValueError(f"durability must be 'fsync' or 'os', not {durability!r}")
        self.path = path
        self.durability = durability
        memory = str(path) == ":memory:"
        # the writer never waits for a lock (the loop applies statements on it): a
        # database that another process holds fails the commit at once, to be retried
        self._db = self._connect(path, WRITER_CACHE_KIB, timeout=0.0)
        self._create()
        self._reader = self._db if memory else self._connect(path, READER_CACHE_KIB)
        self._open = Batch(1)
        self._retry: list[Batch] = []  # batches whose commit failed, to try again first
        self._durable = 0
        # a write schedules a commit only when none runs or is scheduled (`_wake`)
        self._committing = False
        self._wake = False
        self._streak = 0  # light batches committed inline since the last threaded commit
        self._auto_checkpoint = True  # SQLite's automatic checkpoint is on
        self._callbacks: deque[tuple[int, Callable[[], None]]] = deque()
        self._inserts: dict[int, tuple[list[Row | None], int]] = {}
        self._endpoint_rows: dict[bytes, tuple[list[Row | None], int, bool]] = {}
        self._deferred: list[Callable[[], None]] = []  # writers run when the batch is taken
        self._threaded = threaded and not memory
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssb-store")
            if self._threaded
            else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_failure: Callable[[BaseException], None] | None = None
        self._on_trouble: Callable[[str | None], None] | None = None
        self.failed: BaseException | None = None
        self.trouble: str | None = None
        self.fail_next: BaseException | None = None  # tests: the next commit raises this
        self.commits = 0
        self.rows_written = 0
        self.cancelled = 0  # message rows never written (deleted before their batch ran)
        # told (on the event loop) the rows and seconds of each commit that succeeded
        self.commit_observer: Callable[[int, float], None] | None = None
        self._last_commit = (0, 0.0)

    def _connect(
        self, path: Path | str, cache_kib: int, timeout: float = 5.0
    ) -> sqlite3.Connection:
        db = sqlite3.connect(path, timeout, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA foreign_keys=OFF")
        db.execute(f"PRAGMA cache_size=-{cache_kib}")
        return db

    def _create(self) -> None:
        db = self._db
        fresh = db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
        if fresh:
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if not fresh and version < SCHEMA_VERSION:
            self._migrate(version)
        if str(self.path) != ":memory:":
            db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if self.durability == 'fsync' else 'NORMAL'}")
        db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
        for statement in (*_TABLES, *_INDEXES):
            db.execute(statement)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _migrate(self, version: int) -> None:
        """Upgrade a store written by an older ssb, in place (one transaction per step)."""
        db = self._db
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"the store {self.path} was written by a newer ssb (schema {version}); "
                "run that version, or start from a backup"
            )
        if version < 2:
            log.info("migrating the store %s from schema %d to 2", self.path, version)
            started = time.monotonic()
            db.execute("BEGIN")
            db.execute(_TABLES[2].replace("IF NOT EXISTS endpoints", "endpoints_v2"))
            cols = _columns(ENDPOINT_COLUMNS)
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
            for statement in (*_TABLES, *_INDEXES):  # tables added since schema 2 first
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

    # ---- start and stop -------------------------------------------------------------

    def load_meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def load_catalog(self) -> list[tuple[str, str, str]]:
        return self._db.execute("SELECT kind, name, body FROM catalog").fetchall()

    def load_logins(self) -> list[tuple[str, str, float]]:
        return self._db.execute("SELECT name, hash, created FROM logins").fetchall()

    def load_permissions(self) -> tuple[list[Row], list[Row]]:
        """(grants, owners) rows."""
        db = self._db
        grants = db.execute("SELECT login, permission, kind, name FROM grants").fetchall()
        return grants, db.execute("SELECT kind, name, login FROM owners").fetchall()

    def max_ids(self) -> tuple[int, int, int]:
        """Largest queuing order, transmission id and poison incident id on disk."""
        db = self._db
        q = db.execute("SELECT COALESCE(MAX(queuing_order), 0) FROM messages").fetchone()[0]
        t = db.execute("SELECT COALESCE(MAX(id), 0) FROM transmission_queue").fetchone()[0]
        p = db.execute("SELECT COALESCE(MAX(id), 0) FROM poison_messages").fetchone()[0]
        return int(q), int(t), int(p)

    def load_remote(self) -> tuple[list[Row], list[Row]]:
        """The dialog directions to other brokers and their held fragments (transport start)."""
        db = self._db
        dialogs = db.execute(
            "SELECT conversation_id, direction, side, peer, session_key, wrapped_key, next_seq,"
            " envelope FROM remote_dialogs"
        ).fetchall()
        fragments = db.execute(
            "SELECT conversation_id, direction, seq, fragment_index, fragment_count, message_type,"
            " payload FROM held_fragments ORDER BY conversation_id, direction, seq, fragment_index"
        ).fetchall()
        return dialogs, fragments

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[BaseException], None],
        on_trouble: Callable[[str | None], None] | None = None,
    ) -> None:
        self._loop = loop
        self._on_failure = on_failure
        self._on_trouble = on_trouble
        self._wake = self._threaded
        if self._wake and (self._open.rows or self._deferred):
            self._schedule()

    def write_now(self) -> None:
        """Commit what is pending, synchronously; errors propagate (start-up, shutdown)."""
        if self._open.rows or self._retry or self._deferred:
            batches = self._pending()
            self._commit(batches)
            self._settle(batches, None)
            self._run_callbacks()

    def flush(self) -> None:
        """Commit what is pending now, as the store thread would (tests drive durability
        by hand with a store made with threaded=False)."""
        if self._open.rows or self._retry or self._deferred:
            batches = self._pending()
            try:
                self._commit(batches)
            except Exception as exc:
                self._settle(batches, exc)
                return
            self._settle(batches, None)
            self._run_callbacks()

    def discard_pending(self) -> None:
        """Forget every write not yet committed, as a crash would (tests)."""
        self._open = Batch(self._open.number)
        self._retry = []
        self._deferred = []
        self._inserts = {}
        self._endpoint_rows = {}

    async def close(self) -> None:
        if self._committing and self.failed is None and self._loop is not None:
            done: asyncio.Future[None] = self._loop.create_future()
            self.when_durable(self._open.number - 1, lambda: done.set_result(None))
            await done
        self._wake = False
        if self.failed is None and self.trouble is None:
            self.write_now()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._reader is not self._db:
            self._reader.close()
        self._db.close()

    # ---- durability ---------------------------------------------------------------------

    def watermark(self) -> int:
        """The batch that must be durable before an answer may leave."""
        if self._open.rows or self._deferred:
            return self._open.number
        return self._open.number - 1

    def defer(self, writer: Callable[[], None]) -> None:
        """Run `writer` just before the open batch is committed, to write rows that would
        otherwise be rewritten many times in one batch (an endpoint's state); the batch
        counts as holding a write from now on."""
        self._deferred.append(writer)
        if self._wake:
            self._schedule()

    @property
    def durable(self) -> int:
        return self._durable

    def when_durable(self, batch: int, callback: Callable[[], None]) -> None:
        if batch <= self._durable:
            callback()
            return
        self._callbacks.append((batch, callback))

    def _run_callbacks(self) -> None:
        callbacks = self._callbacks
        durable = self._durable
        while callbacks and callbacks[0][0] <= durable:
            callbacks.popleft()[1]()

    # ---- group commit ---------------------------------------------------------------------

    def _add(self, sql: str, row: Row, weight: int = 1) -> None:
        self._open.add(sql, row, weight)
        if self._wake:
            self._schedule()

    def _add_tracked(self, sql: str, row: Row) -> tuple[list[Row | None], int]:
        """`_add`, returning where the row went (to cancel or replace it in this batch)."""
        params = self._open.add(sql, row)
        if self._wake:
            self._schedule()
        return params, len(params) - 1

    def _schedule(self) -> None:
        """A write arrived while no commit is under way or scheduled: schedule one."""
        if self._wake and self._loop is not None:
            self._wake = False
            self._loop.call_soon(self._start_flush)

    def _take_open(self) -> Batch:
        writers, self._deferred = self._deferred, []
        for writer in writers:
            writer()
        batch = self._open
        self._open = Batch(batch.number + 1)
        self._inserts = {}
        self._endpoint_rows = {}
        return batch

    def _pending(self) -> list[Batch]:
        """Failed batches first, then the open one: what the next commit writes."""
        batches = self._retry
        self._retry = []
        if self._open.rows or self._deferred:
            batches = [*batches, self._take_open()]
        return batches

    def _start_flush(self) -> None:
        if self._committing or self.failed is not None:
            return
        if not (self._open.rows or self._retry or self._deferred):
            self._wake = True
            return
        assert self._loop is not None and self._executor is not None
        self._committing = True  # (deferred writers write while the batch is taken)
        batches = self._pending()
        weight = sum(batch.weight for batch in batches)
        if self._inline(weight):
            self._streak += 1
            failure: Exception | None = None
            try:
                self._commit(batches, checkpoint=False)
            except Exception as exc:
                failure = exc
            self._flushed(batches, failure, inline=True)
            return
        self._streak = 0
        if self.trouble is not None or not INLINE_WEIGHT < weight <= LOOP_WEIGHT:
            # all on the store thread (see the module's comment)
            future = self._loop.run_in_executor(self._executor, self._commit, batches)
        else:
            try:
                applied = self._apply(batches)
            except Exception as exc:
                self._flushed(batches, exc, inline=True)
                return
            future = self._loop.run_in_executor(self._executor, self._finish, applied)
        future.add_done_callback(lambda f: self._flushed(batches, f.exception()))

    def _inline(self, weight: int) -> bool:
        """Whether to commit batches of `weight` whole on the event loop (see the module's
        comment)."""
        return (
            self.durability == "os"
            and self.trouble is None
            and self._streak < INLINE_STREAK
            and weight <= INLINE_WEIGHT
        )

    def _flushed(
        self, batches: list[Batch], exc: BaseException | None, inline: bool = False
    ) -> None:
        """A commit ended: settle it, start the next, then run what waited for it. The next
        commit starts first, so that the store thread writes it while the loop answers
        (after an inline commit, it starts from the event loop's next turn, so that
        commits never nest)."""
        self._committing = False
        self._settle(batches, exc)
        if self.failed is not None:
            return
        assert self._loop is not None
        if self._retry:
            self._loop.call_later(RETRY_DELAY, self._start_flush)
        elif self._open.rows or self._deferred:
            if not inline:
                self._start_flush()
            else:
                self._committing = True  # nothing else starts a commit in between
                self._loop.call_soon(self._next_flush)
        else:
            self._wake = True
        self._run_callbacks()

    def _next_flush(self) -> None:
        self._committing = False
        self._start_flush()

    def _settle(self, batches: list[Batch], exc: BaseException | None) -> None:
        """A commit of `batches` ended: make them durable, keep them to retry, or fail
        (the caller runs the callbacks of what became durable)."""
        if exc is not None:
            if not _transient(exc):
                self.failed = exc
                if self._on_failure is not None:
                    self._on_failure(exc)
                return
            reason = describe_failure(exc)
            if self.trouble is None:
                log.error("store commit failed (%s); retrying every %g s", reason, RETRY_DELAY)
            self.trouble = reason
            if self._on_trouble is not None:
                self._on_trouble(reason)
            self._retry = batches
            return
        if self.trouble is not None:
            log.warning("store commits again after: %s", self.trouble)
            self.trouble = None
            if self._on_trouble is not None:
                self._on_trouble(None)
        self._durable = batches[-1].number
        if self.commit_observer is not None:
            self.commit_observer(*self._last_commit)

    def _commit(self, batches: list[Batch], checkpoint: bool = True) -> None:
        """Write batches in one transaction (on the store thread, or synchronously);
        `checkpoint`: SQLite may checkpoint the WAL in this commit."""
        self._finish(self._apply(batches, checkpoint))

    def _apply(self, batches: list[Batch], checkpoint: bool = True) -> tuple[int, float]:
        """The first half of a commit: BEGIN and the batches' statements (their changes
        are in SQLite's page cache until `_finish` commits them); `checkpoint`: SQLite may
        checkpoint the WAL when they are committed. Returns the rows written and when
        this began (perf_counter), for `_finish`."""
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        db = self._db
        if checkpoint is not self._auto_checkpoint:
            db.execute(f"PRAGMA wal_autocheckpoint={AUTO_CHECKPOINT if checkpoint else 0}")
            self._auto_checkpoint = checkpoint
        started = time.perf_counter()
        if self.trouble is not None and str(self.path) != ":memory:":
            # the last commit failed: let this one reuse the WAL file's own space (a full
            # disk cannot grow it), after moving what it holds into the database
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        rows = 0
        db.execute("BEGIN")
        try:
            for batch in batches:
                for sql, params in batch.statements:
                    live = [p for p in params if p is not _CANCELLED]
                    if len(live) == 1:
                        db.execute(sql, live[0])
                    elif live:
                        columns = _MULTI_ROW.get(sql)
                        if columns is None:
                            db.executemany(sql, live)
                        else:
                            _insert_rows(db, sql, columns, live)
                    if sql in _LIST_STATEMENTS:
                        rows += sum(len(set(p)) for p in live)
                    elif sql is _DELETE_MESSAGE_RANGE:
                        rows += sum(p[1] - p[0] + 1 for p in live)
                    elif sql is _DELETE_TRANSMISSION_SEQS:
                        rows += sum(p[3] - p[2] + 1 for p in live)
                    else:
                        rows += len(live)
        except BaseException:
            self._roll_back()
            raise
        return rows, started

    def _finish(self, applied: tuple[int, float]) -> None:
        """The second half: COMMIT what `_apply` wrote (the WAL written and, with fsync,
        synced; a checkpoint if SQLite's is due)."""
        try:
            self._db.execute("COMMIT")
        except BaseException:
            self._roll_back()
            raise
        rows, started = applied
        self.commits += 1
        self.rows_written += rows
        self._last_commit = (rows, time.perf_counter() - started)

    def _roll_back(self) -> None:
        # SQLite may have rolled back already (a full disk does): keep the first error
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _free_pages(self) -> int:
        return int(self._db.execute("PRAGMA freelist_count").fetchone()[0])

    def _vacuum(self, pages: int) -> None:
        """Return up to `pages` free pages to the file system (store thread). The pragma
        frees one page per step, and a statement that yields no rows is stepped only
        once by `execute`: a script runs it to the end."""
        self._db.executescript(f"PRAGMA incremental_vacuum({pages});")

    async def checkpoint(self) -> int | None:
        """When the store is idle (the daemon calls this): return up to
        `IDLE_VACUUM_PAGES` free pages, truncate the WAL, and say how many free pages are
        left beyond the `KEEP_FREE_PAGES` kept for reuse (0: nothing more to return; None:
        skipped, a commit was under way or the store failed). The
        connections' page caches are emptied each time (the next reads fill them again)."""
        if self._committing or self.failed is not None or self._executor is None:
            return None
        assert self._loop is not None

        def run() -> int:
            surplus = self._free_pages() - KEEP_FREE_PAGES
            if surplus > 0:
                self._vacuum(min(surplus, IDLE_VACUUM_PAGES))
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            left = max(0, self._free_pages() - KEEP_FREE_PAGES)
            self._db.execute("PRAGMA shrink_memory")  # the page cache, until needed again
            return left

        self._committing = True
        self._wake = False
        try:
            left = await self._loop.run_in_executor(self._executor, run)
            if self._reader is not self._db:
                self._reader.execute("PRAGMA shrink_memory")
            return left
        except sqlite3.Error as exc:
            log.info("checkpoint skipped: %s", exc)
            return None
        finally:
            self._committing = False
            self._start_flush()

    def free_bytes(self) -> int:
        """Free space for the store: the file system's plus the store's own free pages."""
        pages = self._reader.execute("PRAGMA freelist_count").fetchone()[0]
        size = self._reader.execute("PRAGMA page_size").fetchone()[0]
        if str(self.path) == ":memory:":
            return 1 << 62
        stat = os.statvfs(Path(self.path).parent)
        return int(stat.f_bavail * stat.f_frsize + pages * size)

    # ---- writes: the catalog and meta ------------------------------------------------------------

    def put_meta(self, key: str, value: str) -> None:
        self._add(_PUT_META, (key, value))

    def put_catalog(self, kind: str, name: str, body: str) -> None:
        self._add(_PUT_CATALOG, (kind, name, body))

    def delete_catalog(self, kind: str, name: str) -> None:
        self._add(_DELETE_CATALOG, (kind, name))

    def put_login(self, row: Row) -> None:
        """(name, hash, created)"""
        self._add("INSERT OR REPLACE INTO logins (name, hash, created) VALUES (?, ?, ?)", row)

    def delete_login(self, name: str) -> None:
        self._add("DELETE FROM logins WHERE name = ?", (name,))

    def put_grant(self, row: Row) -> None:
        """(login, permission, kind, name); kind and name '' for the broker itself"""
        self._add("INSERT OR IGNORE INTO grants VALUES (?, ?, ?, ?)", row)

    def delete_grant(self, row: Row) -> None:
        self._add(
            "DELETE FROM grants WHERE login = ? AND permission = ? AND kind = ? AND name = ?", row
        )

    def put_owner(self, row: Row) -> None:
        """(kind, name, login)"""
        self._add("INSERT OR REPLACE INTO owners VALUES (?, ?, ?)", row)

    def forget_object(self, kind: str, name: str) -> None:
        """A dropped object's owner and the permissions granted on it."""
        self._add("DELETE FROM owners WHERE kind = ? AND name = ?", (kind, name))
        self._add("DELETE FROM grants WHERE kind = ? AND name = ?", (kind, name))

    def forget_login(self, login: str) -> None:
        self._add("DELETE FROM grants WHERE login = ?", (login,))

    # ---- writes: endpoints -----------------------------------------------------------------

    def insert_endpoint(self, row: Row) -> None:
        params, index = self._add_tracked(_INSERT_ENDPOINT, row)
        self._endpoint_rows[row[0].bytes] = (params, index, True)

    def update_endpoint(self, row: Row) -> None:
        """Write an endpoint's whole state (ENDPOINT_COLUMNS order)."""
        key = row[0].bytes
        pending = self._endpoint_rows.get(key)
        if pending is not None and pending[2]:
            pending[0][pending[1]] = row  # inserted in this batch: insert the last state
            return
        if pending is not None:
            pending[0][pending[1]] = _CANCELLED
        params = [row[i] for i in _FULL_AT]
        params += (row[_KEY_AT[0]], row[_KEY_AT[1]])
        self._endpoint_rows[key] = (*self._add_tracked(_UPDATE_ENDPOINT, tuple(params)), False)

    def update_endpoint_hot(self, row: Row) -> None:
        """Write the columns of `HOT_ENDPOINT_COLUMNS` (no index holds them), then the
        endpoint's conversation id and is_initiator, in that order. It goes after any
        earlier write of the endpoint in this batch."""
        self._open.add(_UPDATE_ENDPOINT_HOT, row)
        if self._wake:
            self._schedule()

    def delete_endpoint(self, handle: uuid.UUID) -> None:
        pending = self._endpoint_rows.pop(handle.bytes, None)
        if pending is not None and pending[2]:
            pending[0][pending[1]] = _CANCELLED  # inserted in this batch: never written
            return
        if pending is not None:
            pending[0][pending[1]] = _CANCELLED
        self._add(_DELETE_ENDPOINT, (handle,))

    # ---- writes: messages ------------------------------------------------------------------

    def insert_message(self, row: Row) -> None:
        params = self._open.add(_INSERT_MESSAGE, row, _weight(int(row[_SIZE])))
        self._inserts[row[0]] = (params, len(params) - 1)
        if self._wake:
            self._schedule()

    def _cancel_insert(self, queuing_order: int) -> bool:
        """Cancel the message's insert if it is in the open batch (then it is never written)."""
        pending = self._inserts.pop(queuing_order, None)
        if pending is None:
            return False
        pending[0][pending[1]] = _CANCELLED
        self.cancelled += 1
        return True

    def delete_message(self, queuing_order: int) -> None:
        if not self._cancel_insert(queuing_order):
            self._add(_DELETE_MESSAGE, (queuing_order,))

    def delete_messages(self, orders: Iterable[int]) -> None:
        """Delete many message rows: runs of consecutive orders as ranges (exactly those
        rows, the orders being unique integers), the rest a list of them per statement."""
        written = sorted(order for order in orders if not self._cancel_insert(order))
        if len(written) >= MIN_RANGE:
            written = self._delete_runs(written)
        largest = DELETE_LISTS[-1]
        while len(written) >= DELETE_LISTS[0]:
            part, written = written[:largest], written[largest:]
            size = next(n for n in DELETE_LISTS if n >= len(part))
            self._add(
                _DELETE_MESSAGE_LISTS[size], (*part, *([part[-1]] * (size - len(part)))), len(part)
            )
        for order in written:
            self._add(_DELETE_MESSAGE, (order,))

    def _delete_runs(self, orders: list[int]) -> list[int]:
        """Add a range delete per run of at least MIN_RANGE consecutive orders (sorted,
        distinct); returns the orders outside such runs."""
        rest: list[int] = []
        start = 0
        count = len(orders)
        for end in range(1, count + 1):
            if end < count and orders[end] == orders[end - 1] + 1:
                continue
            if end - start >= MIN_RANGE:
                self._add(_DELETE_MESSAGE_RANGE, (orders[start], orders[end - 1]), end - start)
            else:
                rest.extend(orders[start:end])
            start = end
        return rest

    def delete_conversation_messages(self, queue: str, handle: uuid.UUID) -> None:
        self._add(_DELETE_CONVERSATION_MESSAGES, (queue, handle), UNKNOWN_ROWS)

    def set_message_status(self, queuing_order: int, status: int) -> None:
        self._add(_SET_MESSAGE_STATUS, (status, queuing_order))

    def set_delivery_count(self, queuing_order: int, count: int) -> None:
        self._add(_SET_DELIVERY_COUNT, (count, queuing_order))

    def set_message_extra(self, queuing_order: int, extra: bytes | None) -> None:
        self._add(_SET_MESSAGE_EXTRA, (extra, queuing_order))

    # ---- writes: the transmission queue ---------------------------------------------------------

    def insert_transmission(self, row: Row) -> None:
        self._add(_INSERT_TRANSMISSION, row, _weight(_transmission_size(row)))

    def delete_transmission(self, ident: int) -> None:
        self._add(_DELETE_TRANSMISSION, (ident,))

    def delete_transmission_seqs(
        self, conversation_id: uuid.UUID, is_initiator: bool, first: int, last: int
    ) -> None:
        """Messages `first`..`last` of a direction (one statement for the range)."""
        self._add(
            _DELETE_TRANSMISSION_SEQS,
            (conversation_id, int(is_initiator), first, last),
            last - first + 1,
        )

    def delete_transmission_direction(self, conversation_id: uuid.UUID, is_initiator: bool) -> None:
        self._add(
            _DELETE_TRANSMISSION_DIRECTION, (conversation_id, int(is_initiator)), UNKNOWN_ROWS
        )

    # ---- writes: the transport's dialog state -------------------------------------------------

    def put_remote_dialog(self, row: Row) -> None:
        self._add(_PUT_REMOTE_DIALOG, row)

    def set_remote_next_seq(
        self, conversation_id: uuid.UUID, direction: int, side: str, next_seq: int
    ) -> None:
        self._add(_SET_REMOTE_NEXT_SEQ, (next_seq, conversation_id, direction, side))

    def delete_remote_dialog(self, conversation_id: uuid.UUID, direction: int, side: str) -> None:
        self._add(_DELETE_REMOTE_DIALOG, (conversation_id, direction, side))

    def put_held_fragment(self, row: Row) -> None:
        *_, payload = row
        self._add(_PUT_HELD_FRAGMENT, row, _weight(len(payload)))

    def delete_held_message(self, conversation_id: uuid.UUID, direction: int, seq: int) -> None:
        self._add(_DELETE_HELD_MESSAGE, (conversation_id, direction, seq), UNKNOWN_ROWS)

    def delete_held_direction(self, conversation_id: uuid.UUID, direction: int) -> None:
        self._add(_DELETE_HELD_DIRECTION, (conversation_id, direction), UNKNOWN_ROWS)

    # ---- writes: poison incidents and the execution log --------------------------------------------

    def insert_poison(self, row: Row) -> None:
        self._add(_INSERT_POISON, row)

    def put_execution_log(self, row: Row) -> None:
        """Insert or replace one row, in EXECUTION_LOG_COLUMNS order."""
        self._add(_PUT_EXECUTION_LOG, row)

    def delete_execution_log_upto(self, log_id: int) -> None:
        """Forget every execution log row up to and including `log_id`."""
        self._add(_DELETE_EXECUTION_LOG_UPTO, (log_id,), UNKNOWN_ROWS)

    # ---- writes: transaction outcomes ------------------------------------------------------------

    def insert_outcomes(self, seq: int, at: float, count: int, ids: bytes) -> None:
        self._add(_INSERT_OUTCOMES, (seq, at, count, ids), _weight(len(ids)))

    def delete_outcomes_upto(self, seq: int) -> None:
        self._add(_DELETE_OUTCOMES_UPTO, (seq,), UNKNOWN_ROWS)

    # ---- reads (committed state; on the event loop's own connection) --------------------------------

    def read_endpoint(self, handle: uuid.UUID) -> Row | None:
        row: Row | None = self._reader.execute(
            f"{_ENDPOINT_SELECT} WHERE handle = ?", (handle,)
        ).fetchone()
        return row

    def read_endpoint_by_conversation(
        self, conversation_id: uuid.UUID, is_initiator: bool
    ) -> Row | None:
        row: Row | None = self._reader.execute(
            f"{_ENDPOINT_SELECT} WHERE conversation_id = ? AND is_initiator = ?",
            (conversation_id, int(is_initiator)),
        ).fetchone()
        return row

    def read_endpoints(
        self,
        *,
        group_id: uuid.UUID | None = None,
        service: str | None = None,
        contract: str | None = None,
        after: uuid.UUID | None = None,
        limit: int,
    ) -> list[Row]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("group_id", group_id), ("service", service), ("contract", contract)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            where.append("handle > ?")
            params.append(after)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._reader.execute(
            f"{_ENDPOINT_SELECT}{clause} ORDER BY handle LIMIT ?", (*params, limit)
        ).fetchall()

    def read_outcome_batches(self, first: int) -> Iterable[tuple[int, float, bytes]]:
        """(number, time, ids) of every outcome batch from `first` on, newest first."""
        return self._reader.execute(
            "SELECT seq, time, ids FROM outcome_batches WHERE seq >= ? ORDER BY seq DESC",
            (first,),
        )

    def outcome_batch_heads(self, first: int, limit: int) -> list[tuple[int, float, int]]:
        """(number, time, count) of the oldest outcome batches from `first` on."""
        return self._reader.execute(
            "SELECT seq, time, count FROM outcome_batches WHERE seq >= ? ORDER BY seq LIMIT ?",
            (first, limit),
        ).fetchall()

    def outcome_at(self, seq: int) -> float | None:
        """The commit time of outcome batch `seq` (None when it is not kept)."""
        row = self._reader.execute(
            "SELECT time FROM outcome_batches WHERE seq = ?", (seq,)
        ).fetchone()
        return None if row is None else float(row[0])

    def outcome_span(self) -> tuple[int, int, int] | None:
        """The first and last outcome batch numbers kept and how many ids they hold."""
        row = self._reader.execute(
            "SELECT MIN(seq), MAX(seq), SUM(count) FROM outcome_batches"
        ).fetchone()
        return None if row[0] is None else (int(row[0]), int(row[1]), int(row[2]))

    def count_rows(self, table: str) -> int:
        """How many rows a table holds (endpoints, transmission_queue, messages)."""
        if table not in ("endpoints", "transmission_queue", "messages"):
            raise ValueError(f"no count for table {table!r}")
        return int(self._reader.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    def read_groups(self, limit: int) -> list[Row]:
        """(group id, a service of it, endpoints) per conversation group, by group id."""
        return self._reader.execute(
            "SELECT group_id, MIN(service), COUNT(*) FROM endpoints GROUP BY group_id"
            " ORDER BY group_id LIMIT ?",
            (limit,),
        ).fetchall()

    def read_due_endpoints(self, after: float | None, until: float) -> list[Row]:
        low = float("-inf") if after is None else after
        rows = self._reader.execute(
            "SELECT handle, timer_at, lifetime_expiry FROM endpoints"
            " WHERE timer_at IS NOT NULL AND timer_at > ? AND timer_at <= ?",
            (low, until),
        ).fetchall()
        rows += self._reader.execute(
            "SELECT handle, timer_at, lifetime_expiry FROM endpoints"
            " WHERE lifetime_expiry IS NOT NULL AND lifetime_expiry > ? AND lifetime_expiry <= ?",
            (low, until),
        ).fetchall()
        return rows

    def read_ready_messages(
        self,
        queue: str,
        handle: uuid.UUID,
        first: int,
        before: int | None,
        limit: int,
        max_bytes: int,
    ) -> list[Row]:
        top = (1 << 62) if before is None else before
        rows: list[Row] = []
        used = 0
        cursor = self._reader.execute(
            f"{_MESSAGE_SELECT} WHERE status = 1 AND queue = ? AND handle = ?"
            " AND queuing_order >= ? AND queuing_order < ? ORDER BY queuing_order LIMIT ?",
            (queue, handle, first, top, limit),
        )
        try:
            for row in cursor:  # stepped one row at a time: nothing is read past the budget
                rows.append(row)
                used += row[_SIZE]
                if used >= max_bytes:
                    break
        finally:
            cursor.close()
        return rows

    def _bounded(
        self, sql: str, params: Row, size: Callable[[Row], int], max_bytes: int
    ) -> list[Row]:
        """Rows of `sql` while their sizes add up to at most `max_bytes` (at least one)."""
        rows: list[Row] = []
        used = 0
        cursor = self._reader.execute(sql, params)
        try:
            for row in cursor:
                used += size(row)
                if rows and used > max_bytes:
                    break
                rows.append(row)
        finally:
            cursor.close()
        return rows

    def next_ready_order(
        self, queue: str, handle: uuid.UUID, after: int, before: int | None
    ) -> int | None:
        row = self._reader.execute(
            "SELECT queuing_order FROM messages WHERE status = 1 AND queue = ? AND handle = ?"
            " AND queuing_order > ? AND queuing_order < ? ORDER BY queuing_order LIMIT 1",
            (queue, handle, after, (1 << 62) if before is None else before),
        ).fetchone()
        return None if row is None else int(row[0])

    def read_message_bodies(self, orders: Sequence[int]) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        for start in range(0, len(orders), READ_CHUNK):
            chunk = list(orders[start : start + READ_CHUNK])
            marks = ", ".join("?" for _ in chunk)
            for order, body in self._reader.execute(
                f"SELECT queuing_order, body FROM messages WHERE queuing_order IN ({marks})", chunk
            ):
                found[order] = body
        return found

    def read_message(self, queuing_order: int) -> Row | None:
        row: Row | None = self._reader.execute(
            f"{_MESSAGE_SELECT} WHERE queuing_order = ?", (queuing_order,)
        ).fetchone()
        return row

    def message_enqueue_time(self, queuing_order: int) -> float | None:
        """When the message was enqueued (None: no such durable message)."""
        row = self._reader.execute(
            "SELECT enqueue_time FROM messages WHERE queuing_order = ?", (queuing_order,)
        ).fetchone()
        return None if row is None else float(row[0])

    def read_queue_messages(
        self, queue: str, after: int | None, limit: int, max_bytes: int
    ) -> list[Row]:
        sql = (
            f"{_MESSAGE_SELECT} WHERE queuing_order > ? AND queue = ? AND status IN (0, 1, 7)"
            " ORDER BY queuing_order LIMIT ?"
        )
        return self._bounded(sql, (after or 0, queue, limit), _message_size, max_bytes)

    def message_summary(self, statuses: Iterable[int]) -> list[Row]:
        """Per (status, queue, conversation): count, bytes, first queuing order, and the
        endpoint's service, group, priority and contract (NULL without an endpoint).

        Start-up reads every message's index entry once; on a deep backlog that scan is
        most of the time to ready, so it runs in slices of the handle range, each on its
        own connection and thread (SQLite releases the GIL while it steps)."""
        chosen = sorted({int(s) for s in statuses})
        parts = [
            (status, queue, lo, hi)
            for status, queue in self._status_queues(chosen)
            for lo, hi in _HANDLE_SLICES
        ]
        if str(self.path) == ":memory:" or len(parts) <= 1:
            return [row for part in parts for row in self._summary_slice(self._db, *part)]
        workers = min(len(_HANDLE_SLICES), os.cpu_count() or 1)
        connections = [self._connect(self.path, READER_CACHE_KIB) for _ in range(workers)]
        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="ssb-start") as pool:
                slices = pool.map(
                    lambda i: [
                        row
                        for part in parts[i::workers]
                        for row in self._summary_slice(connections[i], *part)
                    ],
                    range(workers),
                )
                return [row for rows in slices for row in rows]
        finally:
            for db in connections:
                db.close()

    def _status_queues(self, statuses: Sequence[int]) -> list[tuple[int, str]]:
        """The distinct (status, queue) pairs among `statuses`, one index seek each."""
        found: list[tuple[int, str]] = []
        for status in statuses:
            queue = ""
            while True:
                row = self._db.execute(
                    "SELECT queue FROM messages WHERE status = ? AND queue > ?"
                    " ORDER BY queue LIMIT 1",
                    (status, queue),
                ).fetchone()
                if row is None:
                    break
                queue = row[0]
                found.append((status, queue))
        return found

    @staticmethod
    def _summary_slice(
        db: sqlite3.Connection, status: int, queue: str, lo: bytes, hi: bytes | None
    ) -> list[Row]:
        upper = "" if hi is None else " AND handle < ?"
        params: tuple[Any, ...] = (status, queue, lo) if hi is None else (status, queue, lo, hi)
        return db.execute(
            "SELECT s.status, s.queue, s.handle, s.n, s.bytes, s.first,"
            " e.service, e.group_id, e.priority, e.contract FROM"
            " (SELECT status, queue, handle, COUNT(*) AS n, SUM(size) AS bytes,"
            " MIN(queuing_order) AS first FROM messages"
            f" WHERE status = ? AND queue = ? AND handle >= ?{upper}"
            " GROUP BY handle) AS s"
            " LEFT JOIN endpoints AS e ON e.handle = s.handle",
            params,
        ).fetchall()

    def read_messages_with_status(self, statuses: Iterable[int]) -> list[Row]:
        chosen = sorted({int(s) for s in statuses})
        marks = ", ".join("?" for _ in chosen)
        return self._db.execute(f"{_MESSAGE_SELECT} WHERE status IN ({marks})", chosen).fetchall()

    def read_transmission(
        self,
        conversation_id: uuid.UUID,
        is_initiator: bool,
        first: int,
        before: int | None,
        limit: int,
        max_bytes: int,
    ) -> list[Row]:
        sql = (
            f"{_TRANSMISSION_SELECT} WHERE conversation_id = ? AND is_initiator = ?"
            " AND seq >= ? AND seq < ? ORDER BY seq LIMIT ?"
        )
        top = (1 << 62) if before is None else before
        params = (conversation_id, int(is_initiator), first, top, limit)
        return self._bounded(sql, params, _transmission_size, max_bytes)

    def next_transmission_seq(
        self, conversation_id: uuid.UUID, is_initiator: bool, after: int, before: int | None
    ) -> int | None:
        row = self._reader.execute(
            "SELECT seq FROM transmission_queue WHERE conversation_id = ? AND is_initiator = ?"
            " AND seq > ? AND seq < ? ORDER BY seq LIMIT 1",
            (conversation_id, int(is_initiator), after, (1 << 62) if before is None else before),
        ).fetchone()
        return None if row is None else int(row[0])

    def transmission_summary(self) -> list[Row]:
        return self._db.execute(
            "SELECT conversation_id, is_initiator, COUNT(*), MIN(seq) FROM transmission_queue"
            " GROUP BY conversation_id, is_initiator"
        ).fetchall()

    def read_transmission_page(self, after: int | None, limit: int) -> list[Row]:
        return self._reader.execute(
            f"{_TRANSMISSION_SELECT} WHERE id > ? ORDER BY id LIMIT ?", (after or 0, limit)
        ).fetchall()

    def read_poison(self, limit: int) -> list[Row]:
        rows = self._reader.execute(
            f"SELECT {_columns(POISON_COLUMNS[:-1])} FROM poison_messages ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        rows.reverse()
        return rows

    def execution_log(self, limit: int) -> list[Row]:
        """The newest `limit` rows, oldest first."""
        rows = self._reader.execute(
            f"SELECT {_columns(EXECUTION_LOG_COLUMNS)} FROM execution_log"
            " ORDER BY log_id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        rows.reverse()
        return rows

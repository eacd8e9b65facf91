"""The embedded store: every SQL statement of the broker lives in this module.

Theory of operation. The broker's authoritative state is in memory (catalog,
endpoints, queues, locks); SQLite in WAL mode is its durable log and the source it
is rebuilt from at start. The core appends writes to the *open batch* as it mutates
memory, always in one synchronous stretch per operation, so a batch never holds
half of an operation. One batch at a time is committed by a single store thread in
one SQLite transaction (one fsync with `durability="fsync"`, none with `"os"`:
then the WAL is in the OS and survives a daemon crash but not a power cut). While
a batch commits, new writes collect in the next one: that is group commit.

Batches are numbered. `watermark()` is the number of the newest batch holding a
write, and `when_durable(n, callback)` runs the callback on the event loop once
batch `n` is on disk. The server answers a request only when everything applied
before its answer is durable, so nothing a client observes can be lost by a crash.
A failed commit leaves memory ahead of disk, which cannot be repaired in place: the
store reports it as fatal and the daemon stops; a restart rebuilds from disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

SCHEMA_VERSION: Final = 1

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS catalog ("
    " kind TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,"
    " PRIMARY KEY (kind, name))",
    "CREATE TABLE IF NOT EXISTS endpoints ("
    " handle BLOB PRIMARY KEY, conversation_id BLOB NOT NULL, is_initiator INTEGER NOT NULL,"
    " service TEXT NOT NULL, far_service TEXT NOT NULL, far_broker_instance TEXT,"
    " contract TEXT NOT NULL, group_id BLOB NOT NULL, state TEXT NOT NULL,"
    " send_seq INTEGER NOT NULL, receive_seq INTEGER NOT NULL, priority INTEGER NOT NULL,"
    " lifetime_expiry REAL, timer_at REAL, far_handle BLOB, created REAL NOT NULL,"
    " extra BLOB)",
    "CREATE TABLE IF NOT EXISTS messages ("
    " queuing_order INTEGER PRIMARY KEY, queue TEXT NOT NULL, handle BLOB NOT NULL,"
    " seq INTEGER NOT NULL, message_type TEXT NOT NULL, validation TEXT NOT NULL,"
    " body BLOB NOT NULL, enqueue_time REAL NOT NULL, status INTEGER NOT NULL,"
    " delivery_count INTEGER NOT NULL, extra BLOB)",
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
    # the seed-000 scheduler's execution log (see broker/_scheduler.py)
    "CREATE TABLE IF NOT EXISTS execution_log ("
    " log_id INTEGER PRIMARY KEY, caller INTEGER, scheduler_handle BLOB, task TEXT NOT NULL,"
    " queued_time REAL NOT NULL, start_time REAL, end_time REAL, activated_task INTEGER,"
    " pid INTEGER, session_id INTEGER, error TEXT)",
)

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


def _insert(table: str, columns: Sequence[str], verb: str = "INSERT") -> str:
    marks = ", ".join("?" for _ in columns)
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({marks})"


_PUT_META: Final = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"
_PUT_CATALOG: Final = "INSERT OR REPLACE INTO catalog (kind, name, body) VALUES (?, ?, ?)"
_DELETE_CATALOG: Final = "DELETE FROM catalog WHERE kind = ? AND name = ?"
_PUT_ENDPOINT: Final = _insert("endpoints", ENDPOINT_COLUMNS, "INSERT OR REPLACE")
_DELETE_ENDPOINT: Final = "DELETE FROM endpoints WHERE handle = ?"
_INSERT_MESSAGE: Final = _insert("messages", MESSAGE_COLUMNS)
_DELETE_MESSAGE: Final = "DELETE FROM messages WHERE queuing_order = ?"
_SET_MESSAGE_STATUS: Final = "UPDATE messages SET status = ? WHERE queuing_order = ?"
_SET_DELIVERY_COUNT: Final = "UPDATE messages SET delivery_count = ? WHERE queuing_order = ?"
_SET_MESSAGE_EXTRA: Final = "UPDATE messages SET extra = ? WHERE queuing_order = ?"
_INSERT_TRANSMISSION: Final = _insert("transmission_queue", TRANSMISSION_COLUMNS, "INSERT OR REPLACE")
_DELETE_TRANSMISSION: Final = "DELETE FROM transmission_queue WHERE id = ?"
_SET_TRANSMISSION_STATUS: Final = "UPDATE transmission_queue SET status = ? WHERE id = ?"
_PUT_REMOTE_DIALOG: Final = (
    "INSERT OR REPLACE INTO remote_dialogs (conversation_id, direction, side, peer, session_key,"
    " wrapped_key, next_seq, envelope) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SET_REMOTE_NEXT_SEQ: Final = (
    "UPDATE remote_dialogs SET next_seq = ? WHERE conversation_id = ? AND direction = ?"
    " AND side = ?"
)
_DELETE_REMOTE_DIALOG: Final = "DELETE FROM remote_dialogs WHERE conversation_id = ? AND direction = ? AND side = ?"
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
_INSERT_POISON: Final = (
    "INSERT INTO poison_messages (id, queue, handle, queuing_order, delivery_count, action,"
    " time, error, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

Row = tuple[Any, ...]


@dataclass
class Snapshot:
    """Everything the core needs to rebuild its memory at start."""

    meta: dict[str, str] = field(default_factory=dict)
    catalog: list[tuple[str, str, str]] = field(default_factory=list)
    endpoints: list[Row] = field(default_factory=list)
    messages: list[Row] = field(default_factory=list)
    transmission: list[Row] = field(default_factory=list)
    poison: list[Row] = field(default_factory=list)


class StoreFailure(RuntimeError):
    """A batch could not be committed; memory is ahead of disk."""


def _uuid_adapter(value: uuid.UUID) -> bytes:
    return value.bytes


sqlite3.register_adapter(uuid.UUID, _uuid_adapter)


class Store:
    """SQLite-backed durable log with group commit on one background thread."""

    def __init__(self, path: Path, durability: str = "fsync") -> None:
        if durability not in ("fsync", "os"):
            raise ValueError(f"durability must be 'fsync' or 'os', not {durability!r}")
        self.path = path
        self.durability = durability
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durability == 'fsync' else 'NORMAL'}")
        self._db.execute("PRAGMA foreign_keys=OFF")
        for statement in _SCHEMA:
            self._db.execute(statement)
        self._batch: list[tuple[str, list[Row]]] = []
        self._open_batch = 1  # number of the batch currently collecting writes
        self._durable = 0  # newest batch known to be on disk
        self._flushing = False
        self._flush_scheduled = False
        self._callbacks: deque[tuple[int, Callable[[], None]]] = deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssb-store")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_failure: Callable[[BaseException], None] | None = None
        self.failed: BaseException | None = None
        self.commits = 0
        self.rows_written = 0

    # ---- start and stop -------------------------------------------------

    def load_meta(self) -> dict[str, str]:
        """The broker's own settings (its instance id), without reading anything else."""
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def load(self) -> Snapshot:
        """Read the core's state back (called once, before the loop starts serving)."""
        db = self._db
        snap = Snapshot()
        snap.meta = self.load_meta()
        snap.catalog = db.execute("SELECT kind, name, body FROM catalog").fetchall()
        snap.endpoints = db.execute(
            f"SELECT {', '.join(ENDPOINT_COLUMNS)} FROM endpoints ORDER BY created"
        ).fetchall()
        snap.messages = db.execute(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages ORDER BY queuing_order"
        ).fetchall()
        snap.transmission = db.execute(
            f"SELECT {', '.join(TRANSMISSION_COLUMNS)} FROM transmission_queue ORDER BY id"
        ).fetchall()
        snap.poison = db.execute(
            "SELECT id, queue, handle, queuing_order, delivery_count, action, time, error"
            " FROM poison_messages ORDER BY id"
        ).fetchall()
        return snap

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

    def max_ids(self) -> tuple[int, int, int]:
        """Largest queuing order, transmission id and poison incident id on disk."""
        db = self._db
        q = db.execute("SELECT COALESCE(MAX(queuing_order), 0) FROM messages").fetchone()[0]
        t = db.execute("SELECT COALESCE(MAX(id), 0) FROM transmission_queue").fetchone()[0]
        p = db.execute("SELECT COALESCE(MAX(id), 0) FROM poison_messages").fetchone()[0]
        return int(q), int(t), int(p)

    def attach(
        self, loop: asyncio.AbstractEventLoop, on_failure: Callable[[BaseException], None]
    ) -> None:
        self._loop = loop
        self._on_failure = on_failure

    def write_now(self) -> None:
        """Commit the open batch synchronously (start-up and shutdown only)."""
        if self._batch:
            batch, self._batch = self._batch, []
            self._commit(batch)
            self._durable = self._open_batch
            self._open_batch += 1
            self._run_callbacks()

    async def close(self) -> None:
        if self._flushing and self.failed is None and self._loop is not None:
            done: asyncio.Future[None] = self._loop.create_future()
            self.when_durable(self._open_batch - 1, lambda: done.set_result(None))
            await done
        self._flush_scheduled = False
        if self.failed is None:
            self.write_now()
        self._executor.shutdown(wait=True)
        self._db.close()

    # ---- durability --------------------------------------------------------

    def watermark(self) -> int:
        """The batch that must be durable before an answer may leave."""
        if self._batch:
            return self._open_batch
        return self._open_batch - 1

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

    # ---- group commit ------------------------------------------------------

    def _add(self, sql: str, row: Row) -> None:
        batch = self._batch
        if batch and batch[-1][0] is sql:
            batch[-1][1].append(row)
        else:
            batch.append((sql, [row]))
        if not self._flushing and not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._start_flush)

    def _start_flush(self) -> None:
        self._flush_scheduled = False
        if self._flushing or not self._batch or self.failed is not None:
            return
        assert self._loop is not None
        batch, self._batch = self._batch, []
        number = self._open_batch
        self._open_batch += 1
        self._flushing = True
        future = self._loop.run_in_executor(self._executor, self._commit, batch)
        future.add_done_callback(lambda f: self._flushed(f, number))

    def _flushed(self, future: asyncio.Future[None], number: int) -> None:
        self._flushing = False
        exc = future.exception()
        if exc is not None:
            self.failed = exc
            if self._on_failure is not None:
                self._on_failure(exc)
            return
        self._durable = number
        self._run_callbacks()
        if self._batch:
            self._start_flush()

    def _commit(self, batch: list[tuple[str, list[Row]]]) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            rows = 0
            for sql, params in batch:
                if len(params) == 1:
                    db.execute(sql, params[0])
                else:
                    db.executemany(sql, params)
                rows += len(params)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.commits += 1
        self.rows_written += rows

    # ---- writes ------------------------------------------------------------

    def put_meta(self, key: str, value: str) -> None:
        self._add(_PUT_META, (key, value))

    def put_catalog(self, kind: str, name: str, body: str) -> None:
        self._add(_PUT_CATALOG, (kind, name, body))

    def delete_catalog(self, kind: str, name: str) -> None:
        self._add(_DELETE_CATALOG, (kind, name))

    def put_endpoint(self, row: Row) -> None:
        self._add(_PUT_ENDPOINT, row)

    def delete_endpoint(self, handle: uuid.UUID) -> None:
        self._add(_DELETE_ENDPOINT, (handle,))

    def insert_message(self, row: Row) -> None:
        self._add(_INSERT_MESSAGE, row)

    def delete_message(self, queuing_order: int) -> None:
        self._add(_DELETE_MESSAGE, (queuing_order,))

    def set_message_status(self, queuing_order: int, status: int) -> None:
        self._add(_SET_MESSAGE_STATUS, (status, queuing_order))

    def set_delivery_count(self, queuing_order: int, count: int) -> None:
        self._add(_SET_DELIVERY_COUNT, (count, queuing_order))

    def set_message_extra(self, queuing_order: int, extra: bytes | None) -> None:
        self._add(_SET_MESSAGE_EXTRA, (extra, queuing_order))

    def put_transmission(self, row: Row) -> None:
        self._add(_INSERT_TRANSMISSION, row)

    def delete_transmission(self, ident: int) -> None:
        self._add(_DELETE_TRANSMISSION, (ident,))

    def set_transmission_status(self, ident: int, status: str) -> None:
        self._add(_SET_TRANSMISSION_STATUS, (status, ident))

    def put_remote_dialog(self, row: Row) -> None:
        self._add(_PUT_REMOTE_DIALOG, row)

    def set_remote_next_seq(
        self, conversation_id: uuid.UUID, direction: int, side: str, next_seq: int
    ) -> None:
        self._add(_SET_REMOTE_NEXT_SEQ, (next_seq, conversation_id, direction, side))

    def delete_remote_dialog(self, conversation_id: uuid.UUID, direction: int, side: str) -> None:
        self._add(_DELETE_REMOTE_DIALOG, (conversation_id, direction, side))

    def put_held_fragment(self, row: Row) -> None:
        self._add(_PUT_HELD_FRAGMENT, row)

    def delete_held_message(self, conversation_id: uuid.UUID, direction: int, seq: int) -> None:
        self._add(_DELETE_HELD_MESSAGE, (conversation_id, direction, seq))

    def delete_held_direction(self, conversation_id: uuid.UUID, direction: int) -> None:
        self._add(_DELETE_HELD_DIRECTION, (conversation_id, direction))

    def insert_poison(self, row: Row) -> None:
        self._add(_INSERT_POISON, row)

    # ---- the scheduler's execution log -------------------------------------

    def put_execution_log(self, row: Row) -> None:
        """Insert or replace one row, in EXECUTION_LOG_COLUMNS order."""
        self._add(_PUT_EXECUTION_LOG, row)

    def delete_execution_log_upto(self, log_id: int) -> None:
        """Forget every execution log row up to and including `log_id`."""
        self._add(_DELETE_EXECUTION_LOG_UPTO, (log_id,))

    def execution_log(self, limit: int) -> list[Row]:
        """The newest `limit` rows, oldest first, read on a connection of its own (WAL
        readers do not disturb the store thread)."""
        db = sqlite3.connect(self.path)
        try:
            rows = db.execute(
                f"SELECT {', '.join(EXECUTION_LOG_COLUMNS)} FROM execution_log"
                " ORDER BY log_id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        finally:
            db.close()
        rows.reverse()
        return rows


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
_PUT_EXECUTION_LOG: Final = _insert("execution_log", EXECUTION_LOG_COLUMNS, "INSERT OR REPLACE")
_DELETE_EXECUTION_LOG_UPTO: Final = "DELETE FROM execution_log WHERE log_id <= ?"

"""The SQLite store as the daemon and `ssb backup` use it: opening a data directory's
store, its errors as StoreErrors, and its online copy."""

from __future__ import annotations

import errno
import sqlite3
import uuid
from pathlib import Path

import pytest

from ssb.broker._store import (
    STORE_FILE,
    SQLiteStore,
    StoreError,
    StoreFailure,
    StoreUnavailable,
    copy_store,
    open_store,
)
from ssb.broker._store.schema import SCHEMA_VERSION
from ssb.broker._store.sqlite import _cannot_open

from .rows import message


def test_a_store_written_by_a_newer_ssb_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / STORE_FILE)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreUnavailable, match="written by a newer ssb"):
        open_store(tmp_path, "fsync")
    db = sqlite3.connect(tmp_path / STORE_FILE)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    db.close()


def test_a_store_that_cannot_be_opened_says_where(tmp_path: Path) -> None:
    (tmp_path / STORE_FILE).mkdir()  # a directory where the file must be
    with pytest.raises(StoreUnavailable, match=f"cannot open the store in {tmp_path}"):
        open_store(tmp_path, "fsync")


def test_a_full_disk_is_named_whatever_sqlite_said(tmp_path: Path) -> None:
    line = _cannot_open(tmp_path, OSError(errno.ENOSPC, "No space left on device"))
    assert line.startswith(f"cannot start: the disk holding {tmp_path} is full (")
    assert "SQLite said: [Errno 28] No space left on device" in line
    assert line.endswith("free some space and start again")
    full = _cannot_open(tmp_path, sqlite3.OperationalError("database or disk is full"))
    assert full.startswith("cannot start: the disk holding")


async def test_database_errors_reach_callers_as_store_errors(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / STORE_FILE, "os", threaded=False)
    store.insert_message(message(1, uuid.uuid4()))
    store.flush()
    store.put_meta("pending", "1")
    store.fail_next = sqlite3.OperationalError("disk I/O error")
    with pytest.raises(StoreFailure, match="disk I/O error"):
        await store.close()  # the last batch cannot be written
    store._reader.close()  # the database gone from under the store
    with pytest.raises(StoreError):
        store.message_enqueue_time(1)
    with pytest.raises(StoreError):
        store.free_bytes()
    store._db.close()


async def test_the_copy_is_the_store_as_committed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / STORE_FILE, "os", threaded=False)
    handle = uuid.uuid4()
    store.insert_message(message(1, handle))
    store.flush()
    store.insert_message(message(2, handle))  # not committed: not in the copy
    target = tmp_path / "copy.db"
    target.touch()
    copy_store(tmp_path / STORE_FILE, target)
    store.discard_pending()
    await store.close()
    copied = SQLiteStore(target, "os", threaded=False)
    try:
        assert [r[0] for r in copied.read_queue_messages("q", None, 10, 1 << 20)] == [1]
    finally:
        await copied.close()
    with pytest.raises(StoreError):
        copy_store(tmp_path / "nothing.db", tmp_path / "other.db")

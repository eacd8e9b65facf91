"""SQLite's group commit: the loop applies a batch's statements and the store thread
commits them; the next batch is applied while the loop runs what waited for the last
one."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from ssb.broker._store import CommitHooks, SQLiteStore
from ssb.broker._store.commit import Plan
from ssb.broker._store.sqlite import (
    INLINE_ROWS,
    INLINE_WEIGHT,
    OS_AUTO_CHECKPOINT,
    OS_INLINE_WEIGHT,
    WAL_SYNC_ROWS,
)


async def test_the_next_commit_starts_before_the_last_ones_callbacks_run(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "broker.db", "fsync")  # every COMMIT on the store thread
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))
    try:
        store.put_meta("first", "1")
        first = store.watermark()
        await asyncio.sleep(0)  # the commit of `first` starts on the store thread
        store.put_meta("second", "2")  # waits in the next batch meanwhile
        second = store.watermark()
        assert second == first + 1
        seen = asyncio.get_running_loop().create_future()

        def write_again() -> None:
            store.put_meta("third", "3")
            seen.set_result(store.watermark())

        store.when_durable(first, write_again)
        # when `first`'s callbacks run, `second` is already taken for the next commit:
        # what they write goes in the batch after it
        third = await asyncio.wait_for(seen, 30)
        assert third == second + 1
        done = asyncio.get_running_loop().create_future()
        store.when_durable(third, lambda: done.set_result(None))
        await asyncio.wait_for(done, 30)
        assert not failures
    finally:
        await store.close()


async def test_a_batch_applied_on_the_loop_is_durable_only_after_its_commit(
    tmp_path: Path,
) -> None:
    """The loop applies a busy batch's statements and the store thread commits them:
    until the COMMIT has run, no other connection sees the writes and nothing that waits
    for the batch (a client's answer) runs."""
    path = tmp_path / "broker.db"
    store = SQLiteStore(path, "fsync")
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))
    gate = threading.Event()
    other = sqlite3.connect(path)
    try:
        assert store._executor is not None
        store._executor.submit(gate.wait, 30)  # the store thread is busy until the gate opens
        for i in range(INLINE_WEIGHT + 1):  # heavier than a lone client's batch
            store.put_meta(f"other{i}", "x")
        store.put_meta("key", "value")
        batch = store.watermark()
        durable = asyncio.Event()
        store.when_durable(batch, durable.set)
        await asyncio.sleep(0)  # the loop applies the batch; its COMMIT waits for the thread
        assert store._db.in_transaction
        assert other.execute("SELECT value FROM meta WHERE key = 'key'").fetchall() == []
        assert not durable.is_set() and store.durable < batch
        gate.set()
        await asyncio.wait_for(durable.wait(), 30)
        assert other.execute("SELECT value FROM meta WHERE key = 'key'").fetchall() == [("value",)]
        assert not failures
    finally:
        gate.set()
        other.close()
        await store.close()


async def test_a_batch_the_loop_cannot_apply_is_retried_and_written_once(
    tmp_path: Path,
) -> None:
    """Another writer holds the database: applying a busy batch on the loop fails, the
    store reports the trouble and tries again; once the other writer is gone the batch is
    written, once, and what waited for it runs."""
    path = tmp_path / "broker.db"
    store = SQLiteStore(path, "fsync")
    failures: list[BaseException] = []
    troubles: list[str | None] = []
    reported = asyncio.Event()

    def trouble(reason: str | None) -> None:
        troubles.append(reason)
        reported.set()

    store.attach(
        asyncio.get_running_loop(), CommitHooks(on_failure=failures.append, on_trouble=trouble)
    )
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        for i in range(INLINE_WEIGHT + 1):  # heavier than a lone client's batch
            store.put_meta(f"other{i}", "x")
        store.put_meta("key", "value")
        durable = asyncio.Event()
        store.when_durable(store.watermark(), durable.set)
        await asyncio.wait_for(reported.wait(), 30)
        assert troubles[0] is not None and "locked" in troubles[0]
        assert not durable.is_set()
        other.execute("ROLLBACK")
        await asyncio.wait_for(durable.wait(), 30)
        assert troubles[-1] is None and store.trouble is None and not failures
        assert other.execute("SELECT value FROM meta WHERE key = 'key'").fetchall() == [("value",)]
    finally:
        other.close()
        await store.close()


def test_with_os_a_batch_of_a_few_hundred_rows_commits_on_the_loop_until_a_checkpoint_is_due(
    tmp_path: Path,
) -> None:
    """With "os" a COMMIT syncs nothing: a batch of up to OS_INLINE_WEIGHT rows commits
    on the event loop, without SQLite's checkpoint, until INLINE_ROWS rows went so; the
    next commit runs on the store thread, which checkpoints. With "fsync" every COMMIT
    is the store thread's."""
    store = SQLiteStore(tmp_path / "os.db", "os", threaded=False)
    synced = SQLiteStore(tmp_path / "fsync.db", "fsync", threaded=False)
    try:
        assert store._plan(OS_INLINE_WEIGHT) is Plan.INLINE
        assert store._plan(OS_INLINE_WEIGHT + 1) is Plan.LOOP  # heavier: the thread commits
        rows = 100
        plans = [store._plan(rows) for _ in range(INLINE_ROWS // rows + 1)]
        assert plans == [Plan.INLINE] * (INLINE_ROWS // rows) + [Plan.LOOP]
        assert store._plan(rows) is Plan.INLINE  # the streak starts again
        assert synced._plan(1) is Plan.THREAD and synced._plan(rows) is Plan.LOOP
    finally:
        store._release()
        synced._release()


async def test_with_os_the_wal_is_synced_ahead_of_the_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With "os" the WAL is synced on a thread of its own once WAL_SYNC_ROWS rows have
    been committed since the last time, so that a checkpoint, which syncs the WAL first,
    finds little left to write while commits wait for it; with "fsync" every commit
    syncs the WAL by itself."""
    synced: list[str] = []
    sync = os.fdatasync

    def recorded(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        sync(fd)

    monkeypatch.setattr(os, "fdatasync", recorded)
    loop = asyncio.get_running_loop()

    async def commit(store: SQLiteStore, rows: int) -> list[str]:
        """Commit `rows` rows; the WAL's syncs that followed."""
        before = len(synced)
        for i in range(rows):
            store.put_meta(f"key{i}", "x")
        durable = asyncio.Event()
        store.when_durable(store.watermark(), durable.set)
        await asyncio.wait_for(durable.wait(), 30)
        if store._wal_syncer is not None:
            await loop.run_in_executor(store._wal_syncer, lambda: None)  # what it queued
        return [name for name in synced[before:] if name == f"{store.path}-wal"]

    store = SQLiteStore(tmp_path / "os.db", "os")
    synced_store = SQLiteStore(tmp_path / "fsync.db", "fsync")
    failures: list[BaseException] = []
    store.attach(loop, CommitHooks(on_failure=failures.append))
    synced_store.attach(loop, CommitHooks(on_failure=failures.append))
    try:
        assert await commit(store, 1) == []  # a commit on the loop
        assert await commit(store, WAL_SYNC_ROWS - 2) == []
        assert len(await commit(store, 1)) == 1  # WAL_SYNC_ROWS since the last sync
        assert await commit(store, 1) == []
        assert len(await commit(store, OS_INLINE_WEIGHT + 1)) == 0  # heavier: on the thread
        assert len(await commit(store, WAL_SYNC_ROWS)) == 1
        assert await commit(synced_store, WAL_SYNC_ROWS) == []
        assert not failures
    finally:
        await store.close()
        await synced_store.close()


async def test_with_os_the_commit_after_a_checkpoint_runs_on_the_store_thread(
    tmp_path: Path,
) -> None:
    """The commit after a checkpoint starts the WAL again, and SQLite syncs the new WAL
    header then, whatever the durability: with "os" that commit runs on the store thread
    instead of the event loop, after SQLite's checkpoint and after the idle one alike;
    the commits after it go back to the loop."""
    store = SQLiteStore(tmp_path / "broker.db", "os")
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))

    async def commit(rows: int) -> None:
        for i in range(rows):
            store.put_meta(f"key{i}", "x")
        durable = asyncio.Event()
        store.when_durable(store.watermark(), durable.set)
        await asyncio.wait_for(durable.wait(), 30)

    try:
        await commit(1)
        assert store._plan(1) is Plan.INLINE
        store._checkpoint_pages = 1  # the next commit on the store thread checkpoints
        await commit(OS_INLINE_WEIGHT + 1)  # heavier: committed on the store thread
        store._checkpoint_pages = OS_AUTO_CHECKPOINT
        store._db.execute(f"PRAGMA wal_autocheckpoint={OS_AUTO_CHECKPOINT}")
        assert store._plan(1) is not Plan.INLINE
        await commit(1)  # (a light batch on the thread: it starts the WAL again)
        assert store._plan(1) is Plan.INLINE
        assert await store.checkpoint() is not None  # the idle checkpoint empties the WAL
        assert store._plan(1) is not Plan.INLINE
        assert not failures
    finally:
        await store.close()

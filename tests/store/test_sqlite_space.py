"""SQLite's free pages: the store gives a drained backlog's space back to the file system
once it is idle, and keeps the WAL checkpointed."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from ssb.broker._store import CommitHooks, SQLiteStore
from ssb.broker._store.schema import PAGE_SIZE
from ssb.broker._store.sqlite import (
    KEEP_FREE_PAGES,
    OS_AUTO_CHECKPOINT,
    RESERVE_FILE,
    open_store,
)

from .rows import message

MESSAGES = 20_000
MIB = 1024 * 1024
BODY = b"x" * 1024


async def _durable(store: SQLiteStore) -> None:
    done = asyncio.get_running_loop().create_future()
    store.when_durable(store.watermark(), lambda: done.set_result(None))
    await asyncio.wait_for(done, 30)


def _attached_store(path: Path) -> tuple[SQLiteStore, uuid.UUID, list[BaseException]]:
    """A store with durability os on the running loop, the handle of a conversation to
    put messages in, and the list its fatal failures go to."""
    store = SQLiteStore(path, "os")
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))
    return store, uuid.uuid4(), failures


def _file_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


async def test_idle_checkpoints_return_the_space_of_deleted_messages(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    store, handle, failures = _attached_store(path)
    for order in range(1, MESSAGES + 1):
        store.insert_message(message(order, handle, body=BODY))
    await _durable(store)
    full = _file_bytes(path)
    assert full > MESSAGES * len(BODY)

    for order in range(1, MESSAGES + 1):
        store.delete_message(order)
    await _durable(store)
    assert _file_bytes(path) >= full  # freed pages stay in the file until the store is idle

    for _ in range(100):  # each call returns a slice; bounded
        if await store.checkpoint() == 0:
            break
    else:
        raise AssertionError("the idle checkpoints never finished returning free pages")
    left = _file_bytes(path)
    assert left < full // 4, f"store still {left} bytes after a drain (was {full})"
    assert left <= (KEEP_FREE_PAGES + 1024) * 4096  # a reserve of free pages, and the schema
    assert not failures
    await store.close()


async def test_deleted_messages_are_not_rewritten_as_zeroed_pages(tmp_path: Path) -> None:
    """A drain frees the pages its messages filled; they are not written once more just
    to zero them (that doubled the WAL a drain writes, and the checkpoints after it)."""
    path = tmp_path / "broker.db"
    store, handle, failures = _attached_store(path)
    count = 2_000
    for order in range(1, count + 1):
        store.insert_message(message(order, handle, body=BODY))
    await _durable(store)
    assert await store.checkpoint() is not None  # the WAL is empty now
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size == 0
    pages = path.stat().st_size // PAGE_SIZE  # nearly all of them the messages'
    store.delete_messages(range(1, count + 1))
    await _durable(store)
    written = wal.stat().st_size // PAGE_SIZE
    assert written < 0.6 * pages, f"{written} pages written to delete {pages} pages of messages"
    assert not failures
    await store.close()


async def test_light_commits_keep_the_wal_checkpointed(tmp_path: Path) -> None:
    """Light batches commit on the event loop without SQLite's automatic checkpoint; the
    store thread still checkpoints every so often, so a stream of them keeps the WAL
    near SQLite's usual size instead of growing with every commit."""
    path = tmp_path / "broker.db"
    store, handle, failures = _attached_store(path)
    commits = 2 * OS_AUTO_CHECKPOINT
    body = b"w" * 3000  # a page a message: the WAL unchecked would pass the limit below
    for order in range(1, commits + 1):  # one message per commit: every batch is light
        store.insert_message(message(order, handle, body=body))
        await _durable(store)
    assert store.commits == commits
    wal = path.with_name(path.name + "-wal").stat().st_size
    limit = 3 * OS_AUTO_CHECKPOINT * PAGE_SIZE
    assert wal < limit, f"the WAL grew to {wal} bytes (checkpointed, it stays under {limit})"
    assert not failures
    await store.close()


async def test_the_disk_reserve_follows_the_setting_it_is_opened_with(tmp_path: Path) -> None:
    """A changed `disk_reserve` applies at the next start: a larger one is made once
    there is room, a smaller one gives the difference back at once, and 0 removes the
    file (the operator who sets it to free space on a full disk gets that space)."""
    reserve = tmp_path / RESERVE_FILE

    async def opened_with(size: int) -> int | None:
        store = open_store(tmp_path, "os", size)
        try:
            assert store.keep_reserve() is None
        finally:
            await store.close()
        return reserve.stat().st_size if reserve.exists() else None

    assert await opened_with(MIB) == MIB
    assert await opened_with(3 * MIB) == 3 * MIB
    assert await opened_with(2 * MIB) == 2 * MIB
    assert await opened_with(0) is None

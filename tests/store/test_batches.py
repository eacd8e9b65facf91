"""Batches and durability: what every store promises about when writes count."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest

from ssb.broker._store import CommitHooks, ManualStore, SQLiteStore, Store

from .rows import message


def test_a_write_is_read_only_once_its_batch_is_committed(storage: ManualStore) -> None:
    assert storage.watermark() == 0 and storage.durable == 0
    storage.put_catalog("queue", "q", "{}")
    assert storage.watermark() == 1
    assert storage.durable == 0
    handle = uuid.uuid4()
    storage.insert_message(message(1, handle))
    assert storage.watermark() == 1  # one open batch
    assert storage.read_message(1) is None  # the open batch is not read
    storage.flush()
    assert storage.durable == 1
    assert storage.watermark() == 1  # nothing written since
    assert storage.read_message(1) is not None
    assert storage.load_catalog() == [("queue", "q", "{}")]
    storage.put_meta("k", "v")
    assert storage.watermark() == 2


def test_callbacks_run_once_their_batch_is_durable_in_the_order_given(
    storage: ManualStore,
) -> None:
    ran: list[str] = []
    storage.when_durable(0, lambda: ran.append("at once"))  # nothing to wait for
    assert ran == ["at once"]
    storage.put_meta("a", "1")
    first = storage.watermark()
    storage.when_durable(first, lambda: ran.append("first"))
    storage.when_durable(first, lambda: ran.append("first again"))
    assert ran == ["at once"]
    storage.flush()
    assert ran == ["at once", "first", "first again"]
    storage.put_meta("b", "2")
    second = storage.watermark()
    storage.when_durable(second, lambda: ran.append("second"))
    storage.when_durable(first, lambda: ran.append("late for first"))  # durable: at once
    assert ran[-1] == "late for first"
    storage.flush()
    assert ran[-1] == "second"


def test_a_deferred_writer_writes_into_the_batch_being_taken(storage: ManualStore) -> None:
    calls: list[int] = []

    def writer() -> None:
        storage.put_meta("deferred", "yes")
        calls.append(storage.watermark())

    storage.defer(writer)
    assert storage.watermark() == 1  # the open batch counts as holding a write
    assert calls == []
    storage.flush()
    assert calls == [1]
    assert storage.durable == 1
    assert storage.load_meta()["deferred"] == "yes"
    storage.flush()  # nothing pending: the writer is not called again
    assert calls == [1]


def test_writes_take_effect_in_the_order_made(storage: ManualStore) -> None:
    handle = uuid.uuid4()
    storage.put_meta("k", "old")
    storage.put_meta("k", "new")
    storage.insert_message(message(1, handle))
    storage.flush()  # message 1 is durable: deleting it below is a real delete
    storage.insert_message(message(2, handle))
    storage.delete_conversation_messages("q", handle)  # 1 and 2
    storage.insert_message(message(3, handle))  # after the delete: stays
    storage.flush()
    assert storage.load_meta()["k"] == "new"
    assert [r[0] for r in storage.read_queue_messages("q", None, 10, 1 << 20)] == [3]


def test_a_crash_loses_only_what_was_not_committed(storage: ManualStore) -> None:
    storage.put_meta("kept", "1")
    storage.flush()
    storage.put_meta("lost", "1")
    storage.discard_pending()
    storage.flush()
    assert storage.load_meta() == {"kept": "1"}


def test_a_commit_that_fails_for_a_passing_cause_is_tried_again(storage: ManualStore) -> None:
    """An I/O error is trouble, not the end: the batch stays, merged with what follows,
    and nothing that waits for it runs until a later commit writes it."""
    ran: list[int] = []
    storage.put_meta("first", "1")
    storage.when_durable(storage.watermark(), lambda: ran.append(1))
    storage.fail_next = OSError("the disk is away")
    storage.flush()
    assert storage.trouble is not None and storage.failed is None
    assert ran == [] and storage.durable == 0
    storage.put_meta("second", "2")
    storage.flush()
    assert storage.trouble is None
    assert ran == [1] and storage.durable == 2
    assert storage.load_meta() == {"first": "1", "second": "2"}


async def test_commits_are_counted(storage: ManualStore) -> None:
    before = storage.commits, storage.rows_written
    storage.put_meta("a", "1")
    storage.put_meta("b", "1")
    storage.flush()
    assert storage.commits == before[0] + 1
    assert storage.rows_written == before[1] + 2
    seen: list[tuple[int, float]] = []
    failures: list[BaseException] = []
    storage.attach(
        asyncio.get_running_loop(),
        CommitHooks(
            on_failure=failures.append,
            on_commit=lambda rows, seconds: seen.append((rows, seconds)),
        ),
    )
    storage.put_meta("c", "1")
    storage.flush()
    assert len(seen) == 1 and seen[0][0] == 1 and seen[0][1] >= 0


def test_free_bytes_counts_the_room_the_store_can_grow_into(storage: ManualStore) -> None:
    """A count of bytes where the store sees its disk; None for a database server's."""
    free = storage.free_bytes()
    if isinstance(storage, SQLiteStore):
        assert free is not None and free > 0
    else:
        assert free is None


async def test_an_attached_store_commits_by_itself_and_keeps_it(
    open_background: Callable[[], Store],
) -> None:
    store = open_background()
    instance = store.load_meta()["broker_instance"]  # a new store has an identity
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), CommitHooks(on_failure=failures.append))
    try:
        handle = uuid.uuid4()
        store.insert_message(message(1, handle))
        durable = asyncio.Event()
        store.when_durable(store.watermark(), durable.set)
        await asyncio.wait_for(durable.wait(), 30)  # nobody asked for a commit
        assert store.read_message(1) is not None
        store.insert_message(message(2, handle))  # pending when the store closes
    finally:
        await store.close()
    assert not failures
    again = open_background()
    try:
        assert again.load_meta()["broker_instance"] == instance
        assert [r[0] for r in again.read_queue_messages("q", None, 10, 1 << 20)] == [1, 2]
    finally:
        await again.close()


def test_batches_given_up_are_never_written(storage: ManualStore) -> None:
    """Given up (the daemon's disk_full_timeout passed): the batches not yet durable and
    everything written since are never written, what waited for them never runs, and the
    store commits nothing more (the daemon starts again from what is durable)."""
    storage.put_meta("kept", "1")
    storage.flush()
    ran: list[int] = []
    storage.put_meta("failed", "1")
    storage.when_durable(storage.watermark(), lambda: ran.append(1))
    storage.fail_next = OSError(28, "No space left on device")
    storage.flush()
    assert storage.trouble is not None and storage.abandoned is None
    storage.put_meta("later", "1")
    storage.abandon()
    assert storage.abandoned == storage.trouble
    storage.put_meta("after", "1")
    storage.flush()
    storage.write_now()
    assert ran == [] and storage.durable == 1
    assert storage.load_meta() == {"kept": "1"}


async def test_commits_that_keep_failing_are_given_up_after_the_time_given(
    open_background: Callable[[], Store],
) -> None:
    store = open_background()
    loop = asyncio.get_running_loop()
    abandoned = loop.create_future()
    troubles: list[str | None] = []
    hooks = CommitHooks(
        on_failure=pytest.fail,
        on_trouble=troubles.append,
        on_abandon=abandoned.set_result,
        abandon_after=0.5,
    )
    store.attach(loop, hooks)

    def full() -> None:
        if isinstance(store, SQLiteStore):
            raise OSError(28, "No space left on device")
        import psycopg  # a PostgreSQL server out of disk answers SQLSTATE 53100

        raise psycopg.errors.DiskFull("could not extend file: No space left on device")

    store._injected_failure = full  # type: ignore[method-assign]  # every commit fails
    try:
        store.put_meta("lost", "1")
        store.when_durable(store.watermark(), lambda: pytest.fail("ran"))
        started = loop.time()
        reason = await asyncio.wait_for(abandoned, 30)
        assert "No space left on device" in reason and troubles and troubles[0] == reason
        assert loop.time() - started <= 0.5 + 0.2  # within the time given, not after it
        assert store.abandoned == reason
        store.put_meta("after", "1")
    finally:
        await store.close()  # writes nothing: the batches were given up
    again = open_background()
    try:
        meta = again.load_meta()
        assert "lost" not in meta and "after" not in meta
    finally:
        await again.close()

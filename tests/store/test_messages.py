"""Messages in queues: what the store writes, cancels and reads back."""

from __future__ import annotations

import uuid

from ssb.broker._core.ports import Span
from ssb.broker._store import ManualStore
from ssb.protocol import ROW_OVERHEAD

from .rows import message, stored

READY, RETAINED, PARKED, REQUEUED = 1, 0, 6, 7


def test_a_message_reads_back_as_written(storage: ManualStore) -> None:
    handle = uuid.uuid4()
    row = message(1, handle, body=b"hello", extra=b"\x80")
    storage.insert_message(row)
    storage.flush()
    assert storage.read_message(1) == stored(row)
    assert storage.message_enqueue_time(1) == row[7]
    assert storage.read_message(2) is None
    assert storage.message_enqueue_time(2) is None
    storage.set_message_status(1, RETAINED)
    storage.set_delivery_count(1, 3)
    storage.set_message_extra(1, None)
    storage.flush()
    changed = storage.read_message(1)
    assert changed is not None and (changed[8], changed[9], changed[10]) == (RETAINED, 3, None)


def test_ready_messages_are_read_in_order_within_a_range_a_count_and_a_budget(
    storage: ManualStore,
) -> None:
    handle, other = uuid.uuid4(), uuid.uuid4()
    for order in range(1, 11):
        storage.insert_message(message(order, handle, body=b"x" * 10))
    storage.insert_message(message(11, other))  # another conversation
    storage.insert_message(message(12, handle, queue="elsewhere"))  # another queue
    storage.insert_message(message(13, handle, status=RETAINED))  # not ready
    storage.insert_message(message(14, handle, body=b"y" * 10))
    storage.flush()

    def orders(first: int, before: int | None, limit: int, max_bytes: int) -> list[int]:
        rows = storage.read_ready_messages("q", handle, Span(first, before, limit, max_bytes))
        return [row[0] for row in rows]

    assert orders(1, None, 100, 1 << 20) == [*range(1, 11), 14]
    assert orders(3, 6, 100, 1 << 20) == [3, 4, 5]
    assert orders(1, None, 2, 1 << 20) == [1, 2]
    assert orders(1, None, 100, 25) == [1, 2, 3]  # the one that reaches the budget is in
    assert orders(1, None, 100, 30) == [1, 2, 3]
    assert orders(1, None, 100, 0) == [1]
    assert orders(11, None, 100, 1 << 20) == [14]
    assert storage.next_ready_order("q", handle, 3, None) == 4
    assert storage.next_ready_order("q", handle, 10, None) == 14
    assert storage.next_ready_order("q", handle, 10, 14) is None
    assert storage.next_ready_order("q", handle, 14, None) is None


def test_bodies_are_read_by_queuing_order(storage: ManualStore) -> None:
    handle = uuid.uuid4()
    orders = list(range(1, 1201))  # more than one read's worth of parameters
    for order in orders:
        storage.insert_message(message(order, handle, body=order.to_bytes(2, "big")))
    storage.flush()
    bodies = storage.read_message_bodies([*orders, 5000])
    assert bodies == {order: order.to_bytes(2, "big") for order in orders}


def test_a_queue_is_read_in_pages_that_fit_a_budget(storage: ManualStore) -> None:
    handle = uuid.uuid4()
    for order, status in enumerate((READY, RETAINED, PARKED, REQUEUED, READY), start=1):
        storage.insert_message(message(order, handle, status=status, body=b"z" * 100))
    storage.insert_message(message(6, handle, queue="other"))
    storage.flush()

    def orders(after: int | None, limit: int, max_bytes: int) -> list[int]:
        return [r[0] for r in storage.read_queue_messages("q", after, limit, max_bytes)]

    one = 100 + ROW_OVERHEAD
    assert orders(None, 10, 1 << 20) == [1, 2, 4, 5]  # not the parked one
    assert orders(2, 10, 1 << 20) == [4, 5]
    assert orders(None, 2, 1 << 20) == [1, 2]
    assert orders(None, 10, 2 * one) == [1, 2]
    assert orders(None, 10, 2 * one - 1) == [1]
    assert orders(None, 10, 0) == [1]  # at least one


def test_deleting_many_messages_removes_exactly_those_and_counts_them(
    storage: ManualStore,
) -> None:
    handle = uuid.uuid4()
    for order in range(1, 1201):
        storage.insert_message(message(order, handle))
    storage.flush()
    written = storage.rows_written
    gone = [*range(2, 5), *range(6, 10), *range(11, 19), *range(100, 700), *range(900, 1000, 3)]
    cancelled = storage.cancelled
    storage.insert_message(message(1201, handle))  # in the open batch: cancelled, never written
    storage.delete_messages([*gone, 1201])
    storage.flush()
    left = {row[0] for row in storage.read_queue_messages("q", None, 5000, 1 << 30)}
    assert left == set(range(1, 1201)) - set(gone)
    assert storage.rows_written - written == len(gone)
    assert storage.cancelled == cancelled + 1


def test_a_message_deleted_in_the_batch_that_inserts_it_is_never_written(
    storage: ManualStore,
) -> None:
    handle = uuid.uuid4()
    storage.insert_message(message(1, handle))
    storage.insert_message(message(2, handle))
    storage.delete_message(1)
    storage.delete_message(7)  # no such message: nothing happens
    storage.flush()
    assert storage.cancelled == 1
    assert storage.read_message(1) is None and storage.read_message(2) is not None
    storage.delete_message(2)  # durable: a real delete
    storage.flush()
    assert storage.cancelled == 1 and storage.read_message(2) is None


def test_a_conversations_messages_are_deleted_by_queue(storage: ManualStore) -> None:
    handle, other = uuid.uuid4(), uuid.uuid4()
    for order, status in enumerate((READY, RETAINED, PARKED, REQUEUED), start=1):
        storage.insert_message(message(order, handle, status=status))
    storage.insert_message(message(5, handle, queue="other"))
    storage.insert_message(message(6, other))
    storage.flush()
    storage.delete_conversation_messages("q", handle)
    storage.flush()
    assert [storage.read_message(o) is None for o in range(1, 7)] == [True] * 4 + [False] * 2


def test_a_queues_messages_are_deleted_whatever_their_status(storage: ManualStore) -> None:
    handle, other = uuid.uuid4(), uuid.uuid4()
    for order, status in enumerate((READY, RETAINED, PARKED, REQUEUED), start=1):
        storage.insert_message(message(order, handle, status=status))
    storage.insert_message(message(5, other))
    storage.insert_message(message(6, handle, queue="other"))
    storage.flush()
    storage.insert_message(message(7, other))  # in the same batch as the delete
    storage.delete_queue_messages("q")
    storage.insert_message(message(8, other))  # after it in the batch: kept
    storage.flush()
    gone = [storage.read_message(o) is None for o in range(1, 9)]
    assert gone == [True] * 5 + [False, True, False]


def test_a_batch_of_any_size_writes_each_of_its_messages_once(storage: ManualStore) -> None:
    """Every count of rows in a batch lands whole and in order (inserts may be grouped
    many to a statement: around each group size too)."""
    handle = uuid.uuid4()
    order = 0
    expected: dict[int, bytes] = {}
    for count in (1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200):
        for _ in range(count):
            order += 1
            body = order.to_bytes(4, "big") * 3
            storage.insert_message(message(order, handle, body=body))
            expected[order] = body
        storage.flush()
        rows = storage.read_queue_messages("q", None, 10_000, 1 << 30)
        assert [row[0] for row in rows] == sorted(expected)
        assert {row[0]: row[6] for row in rows} == expected


def test_start_up_summary_covers_every_conversation_whatever_its_handle(
    storage: ManualStore,
) -> None:
    """A conversation at either end of the handle range, or in its middle, is counted
    once, with its endpoint's identity when it has one."""
    edges = [bytes([b]) + bytes(15) for b in (0x00, 0x7F, 0x80, 0xFF)]
    edges.append(b"\x7f" + b"\xff" * 15)
    handles = [uuid.UUID(bytes=raw) for raw in edges]
    expected = {}
    order = 0
    for queue in ("q1", "q2"):
        for status in (READY, 3):
            for i, handle in enumerate(handles):
                sizes = [10 * (i + 1) + k for k in range(i + 1)]
                first = order + 1
                for size in sizes:
                    order += 1
                    storage.insert_message(
                        message(order, handle, queue=queue, status=status, body=b"x" * size)
                    )
                expected[(status, queue, handle.bytes)] = (len(sizes), sum(sizes), first)
    storage.flush()
    summary = storage.message_summary((READY, 3))
    got = {(r[0], r[1], r[2]): (r[3], r[4], r[5]) for r in summary}
    assert len(summary) == len(got) == len(expected)
    assert got == expected
    assert all(r[6:] == (None, None, None, None) for r in summary)  # no endpoints
    assert storage.message_summary((PARKED,)) == []


def test_messages_out_of_order_are_read_by_status(storage: ManualStore) -> None:
    handle = uuid.uuid4()
    for order, status in enumerate((READY, PARKED, REQUEUED, RETAINED, PARKED), start=1):
        storage.insert_message(message(order, handle, status=status))
    storage.flush()
    rows = storage.read_messages_with_status((PARKED, REQUEUED))
    assert sorted(row[0] for row in rows) == [2, 3, 5]
    assert storage.max_ids() == (5, 0, 0)

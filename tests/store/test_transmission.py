"""The transmission queue: entries by direction in seq order, deleted by range."""

from __future__ import annotations

import uuid

from ssb.broker._core.ports import Span
from ssb.broker._store import ManualStore

from .rows import outbound, stored


def _fill(storage: ManualStore) -> tuple[uuid.UUID, uuid.UUID]:
    """Ten entries of one direction (seqs 1-10, bodies of 10 bytes), two of its other
    side and one of another conversation."""
    conversation, other = uuid.uuid4(), uuid.uuid4()
    for seq in range(1, 11):
        storage.insert_transmission(outbound(seq, conversation, seq, body=b"b" * 10))
    storage.insert_transmission(outbound(11, conversation, 1, is_initiator=0))
    storage.insert_transmission(outbound(12, conversation, 2, is_initiator=0))
    storage.insert_transmission(outbound(13, other, 1))
    storage.flush()
    return conversation, other


def test_a_direction_is_read_in_seq_order_within_a_range_a_count_and_a_budget(
    storage: ManualStore,
) -> None:
    conversation, _ = _fill(storage)

    def seqs(first: int, before: int | None, limit: int, max_bytes: int) -> list[int]:
        rows = storage.read_transmission(conversation, True, Span(first, before, limit, max_bytes))
        return [row[8] for row in rows]

    assert seqs(1, None, 100, 1 << 20) == list(range(1, 11))
    assert seqs(4, 7, 100, 1 << 20) == [4, 5, 6]
    assert seqs(1, None, 3, 1 << 20) == [1, 2, 3]
    assert seqs(1, None, 100, 30) == [1, 2, 3]
    assert seqs(1, None, 100, 29) == [1, 2]
    assert seqs(1, None, 100, 0) == [1]  # at least one
    assert [r[0] for r in storage.read_transmission(conversation, False, Span(0, None, 9, 99))] == [
        11,
        12,
    ]
    first = storage.read_transmission(conversation, True, Span(1, None, 1, 0))
    assert first == [stored(outbound(1, conversation, 1, body=b"b" * 10))]
    assert storage.next_transmission_seq(conversation, True, 3, None) == 4
    assert storage.next_transmission_seq(conversation, True, 3, 4) is None
    assert storage.next_transmission_seq(conversation, True, 10, None) is None


def test_entries_are_deleted_by_id_by_range_and_by_direction(storage: ManualStore) -> None:
    conversation, other = _fill(storage)
    written = storage.rows_written
    storage.delete_transmission(1)
    storage.delete_transmission_seqs(conversation, True, 3, 5)
    storage.flush()
    assert storage.rows_written - written == 4
    left = storage.read_transmission(conversation, True, Span(0, None, 100, 1 << 20))
    assert [r[8] for r in left] == [2, 6, 7, 8, 9, 10]
    storage.delete_transmission_direction(conversation, True)
    storage.flush()
    assert storage.read_transmission(conversation, True, Span(0, None, 100, 1 << 20)) == []
    assert len(storage.read_transmission(conversation, False, Span(0, None, 100, 1 << 20))) == 2
    assert len(storage.read_transmission(other, True, Span(0, None, 100, 1 << 20))) == 1


def test_the_queue_is_summed_up_by_direction_and_paged_by_id(storage: ManualStore) -> None:
    conversation, other = _fill(storage)
    summary = sorted(
        (bytes(c), i, count, first) for c, i, count, first in storage.transmission_summary()
    )
    assert summary == sorted(
        [(conversation.bytes, 1, 10, 1), (conversation.bytes, 0, 2, 1), (other.bytes, 1, 1, 1)]
    )
    assert [r[0] for r in storage.read_transmission_page(None, 5)] == [1, 2, 3, 4, 5]
    assert [r[0] for r in storage.read_transmission_page(10, 5)] == [11, 12, 13]
    assert storage.count_rows("transmission_queue") == 13
    assert storage.max_ids() == (0, 13, 0)

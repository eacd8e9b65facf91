"""Every in-memory record writes exactly the columns its store table has."""

from __future__ import annotations

import uuid
from pathlib import Path

from ssb.broker._core.backlog import MessageCache
from ssb.broker._core.conversations import Endpoint
from ssb.broker._core.delivery import Outbound
from ssb.broker._core.queues import Conversation, Group, Message
from ssb.broker._store import (
    ENDPOINT_COLUMNS,
    MESSAGE_COLUMNS,
    TRANSMISSION_COLUMNS,
    SQLiteStore,
)


class _Clock:
    def time(self) -> float:
        return 0.0

    def call_at(self, when: float, callback: object) -> object:
        raise AssertionError("no timers here")

    def call_soon(self, callback: object) -> None:
        raise AssertionError("no callbacks here")

    def create_future(self) -> object:
        raise AssertionError("no futures here")


def test_row_widths_match_the_tables() -> None:
    u = uuid.uuid4()
    store = SQLiteStore(":memory:")
    cache = MessageCache(1 << 20, store, _Clock())  # type: ignore[arg-type]
    conv = Conversation(cache, store, "q", Group(u), u, 5, "s", "c")
    message = Message(1, conv, 0, "t", "N", b"", 0.0, 0)
    assert len(message.row()) == len(MESSAGE_COLUMNS)
    message.last_error = "with extra"
    assert len(message.row()) == len(MESSAGE_COLUMNS)
    stored = tuple(v.bytes if isinstance(v, uuid.UUID) else v for v in message.row())
    assert conv.message(stored).last_error == "with extra"
    endpoint = Endpoint(u, u, True, "s", "f", None, "c", u, "q")
    assert len(endpoint.row()) == len(ENDPOINT_COLUMNS)
    stored = tuple(v.bytes if isinstance(v, uuid.UUID) else v for v in endpoint.row())
    assert Endpoint.from_row(stored, "q").handle == u
    out = Outbound(1, u, u, "to", None, "from", "c", True, 0, "t", "N", b"", 0.0, 5)
    assert len(out.row()) == len(TRANSMISSION_COLUMNS)
    raw = [v.bytes if isinstance(v, uuid.UUID) else v for v in out.row()]
    assert Outbound.from_row(tuple(raw)).conversation_id == u


def test_an_endpoints_hot_row_matches_the_stores_hot_columns() -> None:
    from ssb.broker._store import HOT_ENDPOINT_COLUMNS

    u = uuid.uuid4()
    endpoint = Endpoint(
        u, uuid.uuid4(), False, "s", "f", "b", "c", u, "q", send_seq=3, receive_seq=7
    )
    full = dict(zip(ENDPOINT_COLUMNS, endpoint.row(), strict=True))
    hot = endpoint.hot_row()
    named = (*HOT_ENDPOINT_COLUMNS, "conversation_id", "is_initiator")
    assert len(hot) == len(named)
    assert hot == tuple(full[c] for c in named)


def test_deleting_many_messages_removes_exactly_those_and_counts_them() -> None:
    u = uuid.uuid4()
    store = SQLiteStore(":memory:", threaded=False)
    cache = MessageCache(1 << 20, store, _Clock())  # type: ignore[arg-type]
    conv = Conversation(cache, store, "q", Group(u), u, 5, "s", "c")
    for order in range(1, 1201):
        store.insert_message(Message(order, conv, order, "t", "N", b"x", 0.0, 0).row())
    store.flush()
    written = store.rows_written
    gone = [*range(2, 5), *range(6, 10), *range(11, 19), *range(100, 700), *range(900, 1000, 3)]
    fresh = Message(1201, conv, 1201, "t", "N", b"x", 0.0, 0)
    store.insert_message(fresh.row())  # in the open batch: cancelled, never written
    store.delete_messages([*gone, 1201])
    store.flush()
    left = {row[0] for row in store.read_queue_messages("q", None, 5000, 1 << 30)}
    assert left == set(range(1, 1201)) - set(gone)
    assert store.rows_written - written == len(gone)
    assert store.cancelled == 1


def test_start_up_summary_covers_every_conversation_whatever_its_handle(tmp_path: Path) -> None:
    """The summary is read in slices of the handle range on several connections: a
    conversation at either end of the range, or at a slice's edge, is counted once."""
    store = SQLiteStore(tmp_path / "broker.db", "os", threaded=False)
    edges = [bytes([b]) + bytes(15) for b in (0x00, 0x7F, 0x80, 0xFF)]
    edges.append(b"\x7f" + b"\xff" * 15)
    handles = [uuid.UUID(bytes=raw) for raw in edges]
    expected = {}
    order = 0
    for queue in ("q1", "q2"):
        for status in (1, 3):
            for i, handle in enumerate(handles):
                sizes = [10 * (i + 1) + k for k in range(i + 1)]
                for size in sizes:
                    order += 1
                    row = (
                        order,
                        queue,
                        handle,
                        order,
                        "t",
                        "NONE",
                        b"x" * size,
                        0.0,
                        status,
                        0,
                        None,
                        size,
                    )
                    store.insert_message(row)
                expected[(status, queue, handle.bytes)] = (len(sizes), sum(sizes))
    store.flush()
    summary = store.message_summary((1, 3))
    got = {(r[0], r[1], r[2]): (r[3], r[4]) for r in summary}
    assert len(summary) == len(got) == len(expected)
    assert got == expected


def test_a_batch_of_any_size_writes_each_of_its_messages_once() -> None:
    """Inserts go many rows to a statement, in chunks of halving sizes: every count of
    rows, around each chunk size too, lands whole and in order."""
    u = uuid.uuid4()
    store = SQLiteStore(":memory:", threaded=False)
    cache = MessageCache(1 << 20, store, _Clock())  # type: ignore[arg-type]
    conv = Conversation(cache, store, "q", Group(u), u, 5, "s", "c")
    order = 0
    expected: dict[int, bytes] = {}
    for count in (1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200):
        for _ in range(count):
            order += 1
            body = order.to_bytes(4, "big") * 3
            store.insert_message(Message(order, conv, order, "t", "N", body, 0.0, len(body)).row())
            expected[order] = body
        store.flush()
        rows = store.read_queue_messages("q", None, 10_000, 1 << 30)
        assert [row[0] for row in rows] == sorted(expected)
        assert {row[0]: row[6] for row in rows} == expected

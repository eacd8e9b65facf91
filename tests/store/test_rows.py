"""The core's records write exactly the columns of the port's rows, in their order."""

from __future__ import annotations

import uuid

from ssb.broker._core.backlog import MessageCache
from ssb.broker._core.conversations import Endpoint
from ssb.broker._core.delivery import Outbound
from ssb.broker._core.queues import Conversation, Group, Message
from ssb.broker._store import (
    ENDPOINT_COLUMNS,
    HOT_ENDPOINT_COLUMNS,
    MESSAGE_COLUMNS,
    TRANSMISSION_COLUMNS,
    ManualStore,
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


def test_row_widths_match_the_tables(storage: ManualStore) -> None:
    u = uuid.uuid4()
    cache = MessageCache(1 << 20, storage, _Clock())  # type: ignore[arg-type]
    conv = Conversation(cache, storage, "q", Group(u), u, 5, "s", "c")
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
    u = uuid.uuid4()
    endpoint = Endpoint(
        u, uuid.uuid4(), False, "s", "f", "b", "c", u, "q", send_seq=3, receive_seq=7
    )
    full = dict(zip(ENDPOINT_COLUMNS, endpoint.row(), strict=True))
    hot = endpoint.hot_row()
    named = (*HOT_ENDPOINT_COLUMNS, "conversation_id", "is_initiator")
    assert len(hot) == len(named)
    assert hot == tuple(full[c] for c in named)

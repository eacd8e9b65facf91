"""Every in-memory record writes exactly the columns its store table has."""

from __future__ import annotations

import uuid

from ssb.broker._conversations import Endpoint
from ssb.broker._engine import Outbound
from ssb.broker._queues import Message
from ssb.broker._store import ENDPOINT_COLUMNS, MESSAGE_COLUMNS, TRANSMISSION_COLUMNS


def test_row_widths_match_the_tables() -> None:
    u = uuid.uuid4()
    message = Message(1, "q", u, u, 0, "s", "c", "t", "N", b"", 0.0, 5)
    assert len(message.row()) == len(MESSAGE_COLUMNS)
    message.last_error = "with extra"
    assert len(message.row()) == len(MESSAGE_COLUMNS)
    endpoint = Endpoint(u, u, True, "s", "f", None, "c", u, "q")
    assert len(endpoint.row()) == len(ENDPOINT_COLUMNS)
    stored = tuple(v.bytes if isinstance(v, uuid.UUID) else v for v in endpoint.row())
    assert Endpoint.from_row(stored, "q").handle == u
    out = Outbound(1, u, u, "to", None, "from", "c", True, 0, "t", "N", b"", 0.0, 5)
    assert len(out.row()) == len(TRANSMISSION_COLUMNS)
    raw = [v.bytes if isinstance(v, uuid.UUID) else v for v in out.row()]
    assert Outbound.from_row(tuple(raw)).conversation_id == u

"""Rows for the store tests, built by column name (the port's column tuples), with
defaults for what a test does not care about."""

from __future__ import annotations

import uuid
from typing import Any

from ssb.broker._store import ENDPOINT_COLUMNS, MESSAGE_COLUMNS, TRANSMISSION_COLUMNS

Row = tuple[Any, ...]


def _row(columns: tuple[str, ...], values: dict[str, Any]) -> Row:
    unknown = set(values) - set(columns)
    assert not unknown, f"no such columns: {unknown}"
    return tuple(values[c] for c in columns)


def message(order: int, handle: uuid.UUID, **values: Any) -> Row:
    """A message row (ready, in queue 'q', body b'x' unless told)."""
    body = values.pop("body", b"x")
    row = {
        "queuing_order": order,
        "queue": "q",
        "handle": handle,
        "seq": order,
        "message_type": "t",
        "validation": "NONE",
        "body": body,
        "enqueue_time": 1000.0 + order,
        "status": 1,
        "delivery_count": 0,
        "extra": None,
        "size": len(body),
    }
    row.update(values)
    return _row(MESSAGE_COLUMNS, row)


def endpoint(handle: uuid.UUID, conversation_id: uuid.UUID, **values: Any) -> Row:
    """An endpoint row (the initiator of service 's', conversation group `handle`)."""
    row = {
        "handle": handle,
        "conversation_id": conversation_id,
        "is_initiator": 1,
        "service": "s",
        "far_service": "f",
        "far_broker_instance": None,
        "contract": "c",
        "group_id": handle,
        "state": "CONVERSING",
        "send_seq": 0,
        "receive_seq": 0,
        "priority": 5,
        "lifetime_expiry": None,
        "timer_at": None,
        "far_handle": None,
        "created": 1000.0,
        "extra": None,
    }
    row.update(values)
    return _row(ENDPOINT_COLUMNS, row)


def outbound(ident: int, conversation_id: uuid.UUID, seq: int, **values: Any) -> Row:
    """A transmission-queue row (from the initiator, body b'x' unless told)."""
    row = {
        "id": ident,
        "handle": conversation_id,
        "conversation_id": conversation_id,
        "to_service": "to",
        "to_broker_instance": None,
        "from_service": "from",
        "contract": "c",
        "is_initiator": 1,
        "seq": seq,
        "message_type": "t",
        "validation": "NONE",
        "body": b"x",
        "enqueue_time": 1000.0,
        "priority": 5,
        "status": "",
        "extra": None,
    }
    row.update(values)
    return _row(TRANSMISSION_COLUMNS, row)


def stored(row: Row) -> Row:
    """`row` as a read returns it: a UUID as its 16 bytes, a bool as 0 or 1."""
    return tuple(
        v.bytes if isinstance(v, uuid.UUID) else int(v) if isinstance(v, bool) else v for v in row
    )


class FirstLease:
    """The fence of a PostgreSQL store that tests make by hand in a new database: the
    lease's first epoch, which no daemon has taken (see `_store/lease.py`)."""

    epoch = 0
    node = "tests"

    def held(self) -> bool:
        return True

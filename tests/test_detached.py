"""Detached transactions: begun on one connection, finished on another (or expired)."""

from __future__ import annotations

import pytest
from setup_objects import seed000

from ssb import client


async def _messages(conn: client.Connection, n: int) -> str:
    init_svc, target_svc, _, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send_many(h, "AsyncSent", [str(i) for i in range(n)])
    return target_q


async def test_commit_from_another_connection(conn: client.Connection) -> None:
    queue = await _messages(conn, 3)
    tid = await conn.begin_transaction(detached=True, timeout=30)
    assert tid is not None
    got = await conn.receive(queue, top=2, timeout=5)
    assert await conn.detach_transaction() == tid
    await conn.close()
    other = await client.connect(conn.url)
    try:
        # still leased: the other connection only sees the rest
        rows = await other.view("open_transactions")
        assert [r["transaction_id"] for r in rows] == [tid] and rows[0]["received_messages"] == 2
        assert [m.message_body for m in await other.peek(queue)] == [b"2"]
        await other.commit_transaction(tid)
        assert await other.view("open_transactions") == []
        assert [m.message_body for m in await other.receive(queue, timeout=5)] == [b"2"]
        with pytest.raises(client.BrokerError, match="committed, rolled back, or expired"):
            await other.commit_transaction(tid)
    finally:
        await other.close()
    assert [m.message_body for m in got] == [b"0", b"1"]


async def test_attach_then_rollback_returns_messages_in_order(conn: client.Connection) -> None:
    queue = await _messages(conn, 3)
    tid = await conn.begin_transaction(detached=True)
    await conn.receive(queue, top=2, timeout=5)
    await conn.detach_transaction()
    other = await client.connect(conn.url)
    try:
        await other.attach_transaction(tid)
        await other.receive(queue, top=1, timeout=5)
        await other.rollback(error="batch failed")
        got = await other.receive(queue, timeout=5)
        assert [(m.message_body, m.delivery_count) for m in got] == [
            (b"0", 2),
            (b"1", 2),
            (b"2", 2),
        ]
    finally:
        await other.close()


async def test_expired_transaction_rolls_back(conn: client.Connection) -> None:
    queue = await _messages(conn, 1)
    await conn.begin_transaction(detached=True, timeout=0.3)
    await conn.receive(queue, timeout=5)
    await conn.detach_transaction()
    (again,) = await conn.receive(queue, timeout=10)
    assert again.message_body == b"0" and again.delivery_count == 2

"""Messages and table rows in one transaction, exactly once through kill -9 and cut
connections.

A producer sends numbered requests (each with an amount) with `run_transaction`. A
consumer, in one transaction each time, RECEIVEs up to a batch of them, INSERTs one
row per message keyed by the message's number (a primary key: a message applied twice
would fail), UPDATEs a running total and SENDs a reply per message. A reader records
the replies it received in committed transactions. Meanwhile the broker is killed
(SIGKILL) and restarted 20 times, or a proxy cuts the consumer's connections at random
frames. At the end the table holds exactly one row per message, the total is the sum of
the amounts, and every reply arrived once.

The load is `SSB_TABLES_MESSAGES` messages (default 2,000, so that the suite stays
within its time; the acceptance figure is 50,000: `SSB_TABLES_MESSAGES=50000`).
"""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from collections.abc import Awaitable, Callable

import pytest
from daemon import BrokerProcess
from faultproxy import FaultPlan, ThreadedFaultProxy
from setup_objects import send_numbered

from ssb import client
from ssb.tools import wait_until

pytestmark = pytest.mark.slow  # load clients, kill -9 and faults

MESSAGES = int(os.environ.get("SSB_TABLES_MESSAGES", "2000"))
KILLS = 20
CONVERSATIONS = 10
BATCH = 100
TAG = struct.Struct(">II")  # conversation number, message number within it


def _amount(conversation: int, index: int) -> int:
    return (conversation * 7 + index) % 97 + 1


async def _setup(url: str) -> list[uuid.UUID]:
    async with await client.connect(url) as conn:
        await conn.create_queue("Replies")
        # cut connections roll transactions back, often several in a row: not poison
        await conn.create_queue("Requests", poison_message_handling={"status": "OFF"})
        await conn.create_service("Client", queue="Replies")
        await conn.create_service("Ledger", queue="Requests", contracts=["DEFAULT"])
        await conn.execute(
            "CREATE TABLE Applied (conversation INT NOT NULL, number INT NOT NULL,"
            " amount INT NOT NULL, conversation_group_id UNIQUEIDENTIFIER NOT NULL,"
            " PRIMARY KEY (conversation, number))"
        )
        await conn.execute("CREATE TABLE Totals (id INT PRIMARY KEY, total BIGINT NOT NULL)")
        await conn.execute("INSERT INTO Totals (id, total) VALUES (1, 0)")
        return [await conn.begin_dialog("Client", "Ledger") for _ in range(CONVERSATIONS)]


async def _produce(url: str, handles: list[uuid.UUID]) -> None:
    async with await client.connect(url, reconnect_deadline=60.0) as conn:
        await send_numbered(conn, handles, MESSAGES // CONVERSATIONS, BATCH, TAG.pack)


async def _consume(url: str, applied: list[int], top: int) -> None:
    """RECEIVE (at most `top`), one INSERT per message, one UPDATE of the total, a SEND
    per message: one transaction; `applied` counts the messages of committed ones."""
    async with await client.connect(url, reconnect_deadline=60.0) as conn:

        async def work(c: client.Connection) -> int:
            messages = await c.receive("Requests", top=top, timeout=0.5)
            total = 0
            for message in messages:
                conversation, number = TAG.unpack(message.message_body)
                amount = _amount(conversation, number)
                await c.execute(
                    "INSERT INTO Applied (conversation, number, amount, conversation_group_id)"
                    " VALUES (@p1, @p2, @p3, @p4)",
                    conversation,
                    number,
                    amount,
                    message.conversation_group_id,
                )
                total += amount
                await c.send(message.conversation_handle, "DEFAULT", message.message_body)
            if messages:
                await c.execute("UPDATE Totals SET total = total + @add WHERE id = 1", add=total)
            return len(messages)

        while applied[0] < MESSAGES:
            applied[0] += await conn.run_transaction(work)


async def _read_replies(url: str, replies: list[tuple[int, int]]) -> None:
    async with await client.connect(url, reconnect_deadline=60.0) as conn:

        async def take(c: client.Connection) -> list[client.Message]:
            return await c.receive("Replies", top=BATCH, timeout=0.5)

        while len(replies) < MESSAGES:
            got = await conn.run_transaction(take)
            replies.extend(TAG.unpack(m.message_body) for m in got)  # committed: counts now


async def _run(
    broker: BrokerProcess,
    consumer_url: str,
    during: Callable[[list[int]], Awaitable[None]] | None = None,
    top: int = BATCH,
) -> None:
    handles = await _setup(broker.url)
    applied = [0]
    replies: list[tuple[int, int]] = []
    producing = asyncio.ensure_future(_produce(broker.url, handles))
    consuming = asyncio.ensure_future(_consume(consumer_url, applied, top))
    reading = asyncio.ensure_future(_read_replies(broker.url, replies))
    try:
        if during is not None:
            await during(applied)
        await asyncio.wait_for(asyncio.gather(producing, consuming, reading), 600)
    finally:
        for task in (producing, consuming, reading):
            task.cancel()
    per = MESSAGES // CONVERSATIONS
    expected = sorted((c, i) for c in range(CONVERSATIONS) for i in range(per))
    assert sorted(replies) == expected, "a reply was lost or came twice"
    async with await client.connect(broker.url) as conn:
        rows = await conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT conversation * 100000 + number), SUM(amount)"
            " FROM Applied"
        )
        total = await conn.execute("SELECT total FROM Totals WHERE id = 1")
    amounts = sum(_amount(c, i) for c, i in expected)
    assert rows.rows == [(MESSAGES, MESSAGES, amounts)]
    assert total.scalar() == amounts


async def test_kill_9_twenty_times_keeps_rows_total_and_replies_exactly_once(
    broker: BrokerProcess,
) -> None:
    async def kill_repeatedly(applied: list[int]) -> None:
        for kill in range(1, KILLS + 1):

            async def progressed(part: int = kill * MESSAGES // (KILLS + 2)) -> bool:
                return applied[0] >= part  # the consumer's committed messages

            await wait_until(progressed, "the consumer's progress", 120, 0.01)
            broker.kill()
            await asyncio.get_running_loop().run_in_executor(None, broker.start)

    await _run(broker, broker.url, kill_repeatedly)


async def test_cut_connections_keep_rows_total_and_replies_exactly_once(
    broker: BrokerProcess,
) -> None:
    cuts = FaultPlan.cuts_both_ways(seed=33, probability=0.003, most=40)
    with ThreadedFaultProxy(broker.client_port, **cuts) as proxy:
        # small transactions: a cut rolls back what it falls into, and run_transaction
        # tries a transaction again a few times only
        await _run(broker, proxy.url(broker.url), top=10)
        stats = proxy.stats
    assert stats.cuts >= 10, stats.as_dict()

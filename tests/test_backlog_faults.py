"""A backlog that lives mostly on disk, and queue quotas, survive kill -9 of the daemon.

With a 1 MiB message cache nearly all of a 20,000-message backlog is only in the store;
a reader killed in the middle of draining it loses nothing and sees nothing twice: what
its acknowledged commits took is gone, what its open transaction held comes back, and
every conversation still arrives in sequence order. A queue quota refuses SENDs (and an
explicit transaction's COMMIT) past its limit; after kill -9 exactly the acknowledged
messages are there, in order, none of the refused ones, and the quota still holds.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from daemon import BrokerProcess
from setup_objects import initiator_and_target

from ssb import client
from ssb.protocol import ErrorCode

pytestmark = pytest.mark.slow  # deep backlogs, kill -9

CACHE = 1024 * 1024  # the smallest message cache the broker allows
CONVERSATIONS = 20
PER_CONVERSATION = 1000
BATCH = 100  # bodies per send_many
BODY_SIZE = 512
TOP = 50
COMMITS_BEFORE_KILL = 150  # of the 400 transactions the drain needs


def _body(conv: int, seq: int) -> bytes:
    return f"{conv}:{seq}:".encode().ljust(BODY_SIZE, b".")


def _parse(body: bytes) -> tuple[int, int]:
    conv, seq, _ = body.split(b":", 2)
    return int(conv), int(seq)


async def _queue_row(conn: client.Connection, name: str) -> dict[str, object]:
    (row,) = [q for q in await conn.view("service_queues") if q["name"] == name]
    return row


async def test_kill_9_during_a_deep_drain_loses_and_repeats_nothing(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "data", config={"message_cache_bytes": CACHE, "min_free_disk": 0}
    ).start()
    try:
        conn = await client.connect(broker.url)
        await initiator_and_target(conn, "DrainQ")
        handles = [await conn.begin_dialog("InitSvc", "TargetSvc") for _ in range(CONVERSATIONS)]
        for start in range(0, PER_CONVERSATION, BATCH):
            await asyncio.gather(
                *(
                    conn.send_many(h, "DEFAULT", [_body(n, s) for s in range(start, start + BATCH)])
                    for n, h in enumerate(handles)
                )
            )
        total = CONVERSATIONS * PER_CONVERSATION
        assert (await _queue_row(conn, "DrainQ"))["messages_ready"] == total
        (res,) = await conn.view("broker_resources")
        assert res["message_cache_bytes"] == CACHE
        assert res["stored_messages"] == total
        assert res["cache_spills"] > 0, "a 10 MB backlog did not spill from a 1 MiB cache"
        assert res["cached_bytes"] <= CACHE
        await conn.close()

        reader = await client.connect(broker.url, reconnect_deadline=0.5)
        taken: list[client.Message] = []  # by acknowledged commits, in commit order
        for _ in range(COMMITS_BEFORE_KILL):
            await reader.begin_transaction()
            got = await reader.receive("DrainQ", top=TOP, timeout=5)
            assert got, f"the queue ran dry after {len(taken)} of {total} messages"
            await reader.commit()
            taken += got
        (res,) = await reader.view("broker_resources")
        assert res["cached_bytes"] <= CACHE
        await reader.begin_transaction()
        in_doubt = await reader.receive("DrainQ", top=TOP, timeout=5)
        assert in_doubt
        broker.kill()  # the transaction holding `in_doubt` is open
        with pytest.raises(client.ConnectionLostError):
            await reader.commit()
        await reader.close()

        broker.start()
        reader = await client.connect(broker.url)
        (res,) = await reader.view("broker_resources")
        assert res["stored_messages"] == total - len(taken)
        after: list[client.Message] = []
        for _ in range(2 * total // TOP):  # bounded: the rest needs fewer RECEIVEs than this
            if len(after) >= total - len(taken):
                break
            async with reader.transaction():
                got = await reader.receive("DrainQ", top=TOP, timeout=5)
            assert got, f"the queue ran dry after {len(taken) + len(after)} of {total} messages"
            after += got
        assert await reader.receive("DrainQ", timeout=0) == []
        (res,) = await reader.view("broker_resources")
        assert res["stored_messages"] == 0
        await reader.close()
    finally:
        broker.kill()

    before_ids = [_parse(m.message_body) for m in taken]
    after_ids = [_parse(m.message_body) for m in after]
    assert len(set(before_ids)) == len(before_ids), "an acknowledged commit took a message twice"
    assert not set(before_ids) & set(after_ids), (
        "a message taken by an acknowledged commit came back"
    )
    assert len(set(after_ids)) == len(after_ids), "a message was delivered twice after the restart"
    doubtful = {_parse(m.message_body) for m in in_doubt}
    assert doubtful <= set(after_ids), "the open transaction's messages did not come back"
    wanted = {(c, s) for c in range(CONVERSATIONS) for s in range(PER_CONVERSATION)}
    missing = wanted - set(before_ids) - set(after_ids)
    assert not missing, (
        f"{len(missing)} acknowledged messages were lost, e.g. {sorted(missing)[:5]}"
    )
    assert len(before_ids) + len(after_ids) == len(wanted)

    sequence: dict[int, list[int]] = {c: [] for c in range(CONVERSATIONS)}
    handle_of: dict[int, uuid.UUID] = {}
    for m in taken + after:
        conv, seq = _parse(m.message_body)
        assert m.message_sequence_number == seq
        assert handle_of.setdefault(conv, m.conversation_handle) == m.conversation_handle
        sequence[conv].append(seq)
        if (conv, seq) not in doubtful:
            assert m.delivery_count == 1, f"{conv}:{seq} delivered {m.delivery_count} times"
    for conv, seqs in sequence.items():
        assert seqs == list(range(PER_CONVERSATION)), f"conversation {conv} out of order"


QUOTA = 200


async def test_kill_9_after_quota_refusals_keeps_exactly_the_acknowledged(
    broker: BrokerProcess,
) -> None:
    conn = await client.connect(broker.url)
    await initiator_and_target(conn, "LimitedQ", max_messages=QUOTA)
    producer = await conn.begin_dialog("InitSvc", "TargetSvc")
    other_dialog = await conn.begin_dialog("InitSvc", "TargetSvc")

    # an explicit transaction whose SENDs fit when made, but not at its COMMIT
    other = await client.connect(broker.url)
    await other.begin_transaction()
    await other.send_many(other_dialog, "DEFAULT", [f"txn:{i}" for i in range(5)])

    acked: list[str] = []
    refused: list[str] = []
    for n in range(QUOTA + 50):
        body = f"auto:{n}"
        try:
            await conn.send(producer, "DEFAULT", body)
        except client.QueueFullError as exc:
            assert exc.code == ErrorCode.QUEUE_FULL
            assert "LimitedQ" in exc.message and f"max_messages = {QUOTA}" in exc.message
            refused.append(body)
            break
        acked.append(body)
    assert len(acked) == QUOTA and len(refused) == 1
    for n in range(QUOTA + 1, QUOTA + 6):  # still full: every further SEND is refused
        with pytest.raises(client.QueueFullError):
            await conn.send(producer, "DEFAULT", f"auto:{n}")
        refused.append(f"auto:{n}")
    with pytest.raises(client.QueueFullError):
        await conn.send_many(producer, "DEFAULT", [b"many:0", b"many:1"])

    with pytest.raises(client.QueueFullError, match="LimitedQ"):
        await other.commit()
    await other.ping()  # the session goes on, with no transaction open
    with pytest.raises(client.TransactionError):
        await other.commit()
    row = await _queue_row(conn, "LimitedQ")
    assert (row["messages_stored"], row["messages_ready"]) == (QUOTA, QUOTA)
    await other.close()
    await conn.close()

    broker.kill()
    broker.start()
    conn = await client.connect(broker.url)
    row = await _queue_row(conn, "LimitedQ")
    assert (row["max_messages"], row["messages_stored"]) == (QUOTA, QUOTA)
    with pytest.raises(client.QueueFullError):  # the quota still counts what is stored
        await conn.send(producer, "DEFAULT", b"after the restart")

    received: list[client.Message] = []
    for _ in range(QUOTA):  # bounded
        async with conn.transaction():
            got = await conn.receive("LimitedQ", top=60, timeout=5)
        assert got, f"the queue ran dry after {len(received)} messages"
        received += got
        if len(received) >= QUOTA:
            break
    assert await conn.receive("LimitedQ", timeout=0) == []
    assert [m.message_body.decode() for m in received] == acked
    assert [m.message_sequence_number for m in received] == list(range(QUOTA))
    assert {m.conversation_handle for m in received} == {received[0].conversation_handle}

    # drained, the queue takes messages again; the refused transaction's dialog works
    await conn.send(other_dialog, "DEFAULT", b"room again")
    (late,) = await conn.receive("LimitedQ", timeout=5)
    assert (late.message_body, late.message_sequence_number) == (b"room again", 0)
    await conn.close()

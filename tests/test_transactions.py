"""Transactional RECEIVE, conversation group locks, rollback, dropped connections."""

from __future__ import annotations

import asyncio

import pytest
from setup_objects import seed000

from ssb import client


async def _dialogs(conn: client.Connection, count: int, per: int) -> tuple[str, list]:
    init_svc, target_svc, _, target_q = await seed000(conn)
    handles = []
    for n in range(count):
        h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
        await conn.send_many(h, "AsyncSent", [f"{n}:{i}" for i in range(per)])
        handles.append(h)
    return target_q, handles


async def test_locked_group_is_never_given_to_another_session(conn: client.Connection) -> None:
    target_q, _ = await _dialogs(conn, count=2, per=3)
    a = await client.connect(conn.url)
    b = await client.connect(conn.url)
    try:
        await a.begin_transaction()
        first = await a.receive(target_q, top=1, timeout=5)
        locked = first[0].conversation_group_id
        await b.begin_transaction()
        other = await b.receive(target_q, timeout=5)
        assert other and all(m.conversation_group_id != locked for m in other)
        # the only group left is locked by a: b waits, then gets nothing
        assert await b.receive(target_q, timeout=0.3) == []
        # b asking for the locked group by id waits until a commits
        waiting = asyncio.ensure_future(
            b.receive(target_q, timeout=10, conversation_group_id=locked)
        )
        await asyncio.sleep(0)  # let the request go out (no timing assumption below)
        more = await a.receive(target_q, timeout=0)  # a may keep taking its own group
        assert all(m.conversation_group_id == locked for m in more)
        assert not waiting.done()
        await a.send(first[0].conversation_handle, "AsyncDone", b"x")
        await a.rollback()  # everything a took goes back, in order
        got = await asyncio.wait_for(waiting, 10)
        assert [m.message_body for m in got] == [first[0].message_body] + [
            m.message_body for m in more
        ]
        assert [m.delivery_count for m in got] == [2] * len(got)
        await b.commit()
    finally:
        await a.close()
        await b.close()
    # a's reply was rolled back with its transaction
    assert all(m.message_type_name != "AsyncDone" for m in await conn.peek("QueueAsyncInitiator"))


async def test_concurrent_transactional_readers_share_nothing(conn: client.Connection) -> None:
    target_q, _ = await _dialogs(conn, count=20, per=25)
    got: list[tuple[str, int]] = []
    per_group_owner: dict[object, int] = {}

    async def reader(n: int) -> None:
        c = await client.connect(conn.url)
        try:
            while True:
                async with c.transaction():
                    msgs = await c.receive(target_q, top=7, timeout=0.5)
                    if not msgs:
                        return
                    groups = {m.conversation_group_id for m in msgs}
                    assert len(groups) == 1, "one RECEIVE returned several groups"
                    for m in msgs:
                        got.append((m.message_body.decode(), n))
                    await asyncio.sleep(0.001)
        finally:
            await c.close()

    await asyncio.gather(*(reader(n) for n in range(4)))
    bodies = [b for b, _ in got]
    assert len(bodies) == 500 and len(set(bodies)) == 500
    # per conversation, bodies were received in order across all readers
    by_conv: dict[str, list[int]] = {}
    for body in bodies:
        conv, i = body.split(":")
        by_conv.setdefault(conv, []).append(int(i))
    assert all(v == list(range(25)) for v in by_conv.values())
    del per_group_owner


async def test_rollback_restores_original_order(conn: client.Connection) -> None:
    target_q, _ = await _dialogs(conn, count=1, per=5)
    async with conn.transaction():
        first = await conn.receive(target_q, top=2, timeout=5)
        second = await conn.receive(target_q, top=2, timeout=5)
        assert [m.message_body for m in first + second] == [b"0:0", b"0:1", b"0:2", b"0:3"]
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await conn.receive(target_q, top=3, timeout=5)
            raise RuntimeError("processing failed")
    again = await conn.receive(target_q, timeout=5)
    assert [m.message_body for m in again] == [b"0:4"]


async def test_autocommit_receive_releases_group_for_other_readers(conn: client.Connection) -> None:
    target_q, _ = await _dialogs(conn, count=1, per=2)
    other = await client.connect(conn.url)
    try:
        (m1,) = await conn.receive(target_q, top=1, timeout=5)
        (m2,) = await other.receive(target_q, top=1, timeout=5)
        assert (m1.message_body, m2.message_body) == (b"0:0", b"0:1")
    finally:
        await other.close()


async def test_dropped_connection_rolls_back(conn: client.Connection) -> None:
    target_q, _ = await _dialogs(conn, count=1, per=3)
    doomed = await client.connect(conn.url)
    await doomed.begin_transaction()
    taken = await doomed.receive(target_q, timeout=5)
    assert len(taken) == 3
    waiter = asyncio.ensure_future(conn.receive(target_q, timeout=10))
    await doomed.close()
    back = await asyncio.wait_for(waiter, 10)
    assert [m.message_body for m in back] == [b"0:0", b"0:1", b"0:2"]


async def test_send_in_transaction_invisible_until_commit(conn: client.Connection) -> None:
    init_svc, target_svc, _, target_q = await seed000(conn)
    async with conn.transaction():
        h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
        await conn.send(h, "AsyncSent", b"later")
        assert await conn.peek(target_q) == []
    (m,) = await conn.receive(target_q, timeout=5)
    assert m.message_body == b"later"


async def test_rolled_back_begin_dialog_leaves_nothing(conn: client.Connection) -> None:
    init_svc, target_svc, _, target_q = await seed000(conn)
    await conn.begin_transaction()
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send(h, "AsyncSent", b"never")
    await conn.rollback()
    assert await conn.view("conversation_endpoints") == []
    assert await conn.peek(target_q) == []
    with pytest.raises(client.NotFoundError):
        await conn.send(h, "AsyncSent", b"x")


class _Stop(Exception):
    pass


@pytest.mark.parametrize("block_raises", [False, True])
async def test_a_refused_begin_lets_nothing_of_its_block_run_alone(
    conn: client.Connection, block_raises: bool
) -> None:
    """`transaction()` writes BEGIN with the block's first statement and hears its answer
    at the block's end. A transaction the connection is attaching (its answer not back
    yet) makes the broker refuse that BEGIN: the block's SEND runs in the attached
    transaction, never by itself; the refusal (or the block's own exception) is raised,
    and nothing is rolled back."""
    init_svc, target_svc, _, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    other = await client.connect(conn.url)
    try:
        tid = await other.begin_transaction(detached=True)
        await other.detach_transaction()
        attaching = asyncio.ensure_future(conn.attach_transaction(tid))
        await asyncio.sleep(0)  # the attach is written, its answer not yet read
        expected = _Stop if block_raises else client.TransactionError
        with pytest.raises(expected):
            async with conn.transaction():
                await conn.send(h, "AsyncSent", b"in the attached transaction")
                if block_raises:
                    raise _Stop()
        await attaching
        assert await other.peek(target_q) == []  # not committed by itself
        await conn.commit()  # the attached transaction, still open, takes it
        (m,) = await other.receive(target_q, timeout=5)
        assert m.message_body == b"in the attached transaction"
    finally:
        await other.close()


def _sync_blocks(url: str, handle: object) -> list[object]:
    """The blocking client's transaction() in each way a block can end (its BEGIN leaves
    with the block's first request, or by itself when there is none)."""
    seen: list[object] = []
    with client.connect_sync(url) as sync:
        with sync.transaction():
            pass  # the BEGIN leaves alone, at the block's end
        with pytest.raises(_Stop), sync.transaction():
            raise _Stop()  # before any request: BEGIN, then ROLLBACK
        with pytest.raises(_Stop), sync.transaction():
            sync.send(handle, "AsyncSent", b"rolled back")
            raise _Stop()
        with sync.transaction():
            sync.send(handle, "AsyncSent", b"committed")
            seen.append(sync.transaction_id)
        seen.append(sync.transaction_id)
        with pytest.raises(client.TransactionError, match="already open"):
            sync.begin_transaction()
            with sync.transaction():  # refused at its start: the transaction is open
                pass
        sync.rollback()
    return seen


async def test_the_blocking_client_s_transaction_blocks(conn: client.Connection) -> None:
    init_svc, target_svc, _, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    inside, after = await asyncio.get_running_loop().run_in_executor(
        None, _sync_blocks, conn.url, h
    )
    assert inside is not None and after is None
    assert [m.message_body for m in await conn.receive(target_q, timeout=5)] == [b"committed"]


async def test_get_conversation_group_locks_without_taking(conn: client.Connection) -> None:
    target_q, _ = await _dialogs(conn, count=1, per=2)
    other = await client.connect(conn.url)
    try:
        async with conn.transaction():
            group = await conn.get_conversation_group(target_q, timeout=5)
            assert group is not None
            assert await other.receive(target_q, timeout=0) == []
            msgs = await conn.receive(target_q, timeout=0, conversation_group_id=group)
            assert len(msgs) == 2
        assert await conn.get_conversation_group(target_q, timeout=0) is None
    finally:
        await other.close()


async def test_transaction_misuse_is_reported(conn: client.Connection) -> None:
    with pytest.raises(client.TransactionError, match="no open transaction"):
        await conn.commit()
    await conn.begin_transaction()
    with pytest.raises(client.TransactionError, match="already open"):
        await conn.begin_transaction()
    await conn.rollback()


async def test_send_waits_for_lock_held_by_other_transaction(conn: client.Connection) -> None:
    init_svc, target_svc, init_q, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send(h, "AsyncSent", b"go")
    holder = await client.connect(conn.url)
    try:
        await holder.begin_transaction()
        (m,) = await holder.receive(target_q, timeout=5)
        other = await client.connect(conn.url)
        try:
            sending = asyncio.ensure_future(other.send(m.conversation_handle, "AsyncDone", b"2nd"))
            await holder.send(m.conversation_handle, "AsyncDone", b"1st")
            assert not sending.done()
            await holder.commit()
            await asyncio.wait_for(sending, 10)
        finally:
            await other.close()
    finally:
        await holder.close()
    got = await conn.receive(init_q, timeout=5)
    assert [x.message_body for x in got] == [b"1st", b"2nd"]

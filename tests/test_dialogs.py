"""Dialogs within one broker: the seed-000 round trip, EOIO, END CONVERSATION, timers."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from setup_objects import seed000

from ssb import client


async def test_seed000_round_trip_and_no_endpoint_left(conn: client.Connection) -> None:
    init_svc, target_svc, init_q, target_q = await seed000(conn)
    handle = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    for i in range(4):
        await conn.send(handle, "AsyncSent", f"<Command LogID='{i}'/>")

    reader = await client.connect(conn.url)
    try:
        for i in range(4):
            async with reader.transaction():
                (task,) = await reader.receive(target_q, top=1, timeout=5)
                assert task.message_type_name == "AsyncSent"
                assert task.message_body == f"<Command LogID='{i}'/>".encode()
                assert task.message_sequence_number == i
                assert task.service_name == target_svc
                assert task.service_contract_name == "AsyncContract"
                await reader.send(task.conversation_handle, "AsyncDone", f"done {i}")
        target_handle = task.conversation_handle

        for i in range(4):
            (done,) = await conn.receive(init_q, top=1, timeout=5, conversation_handle=handle)
            assert done.message_type_name == "AsyncDone"
            assert done.message_body == f"done {i}".encode()
            assert done.conversation_handle == handle
        await conn.end_conversation(handle)

        (end,) = await reader.receive(target_q, timeout=5)
        assert end.message_type_name == client.END_DIALOG
        assert end.conversation_handle == target_handle
        states = {
            r["conversation_handle"]: r["state"] for r in await conn.view("conversation_endpoints")
        }
        assert states == {target_handle: "DI"}
        await reader.end_conversation(target_handle)
    finally:
        await reader.close()
    assert await conn.view("conversation_endpoints") == []
    assert await conn.view("conversation_groups") == []


async def test_ten_thousand_messages_exactly_once_in_order(conn: client.Connection) -> None:
    init_svc, target_svc, _, target_q = await seed000(conn)
    handles = [
        await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract") for _ in range(10)
    ]
    sends = []
    for batch in range(10):
        for n, h in enumerate(handles):
            bodies = [f"{n}:{batch * 100 + i}" for i in range(100)]
            sends.append(conn.send_many(h, "AsyncSent", bodies))
    await asyncio.gather(*sends)

    reader = await client.connect(conn.url)
    seen: dict[int, list[int]] = {n: [] for n in range(10)}
    targets: dict[uuid.UUID, int] = {}
    total = 0
    try:
        while total < 10_000:
            async with reader.transaction():
                msgs = await reader.receive(target_q, top=100, timeout=5)
            assert msgs, f"queue ran dry after {total} messages"
            for m in msgs:
                conv, seq = (int(x) for x in m.message_body.split(b":"))
                targets.setdefault(m.conversation_handle, conv)
                assert targets[m.conversation_handle] == conv
                assert m.message_sequence_number == seq
                seen[conv].append(seq)
            total += len(msgs)
        assert await reader.receive(target_q, timeout=0) == []
    finally:
        await reader.close()
    for conv in range(10):
        assert seen[conv] == list(range(1000)), f"conversation {conv} out of order or incomplete"


async def test_end_with_error_reaches_far_side(conn: client.Connection) -> None:
    init_svc, target_svc, init_q, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send(h, "AsyncSent", b"job")
    (job,) = await conn.receive(target_q, timeout=5)
    await conn.end_conversation(job.conversation_handle, error=42, description="cannot do <this>")
    (err,) = await conn.receive(init_q, timeout=5)
    assert err.message_type_name == client.ERROR
    assert b"<Code>42</Code>" in err.message_body
    assert b"cannot do &lt;this&gt;" in err.message_body
    states = [r["state"] for r in await conn.view("conversation_endpoints")]
    assert states == ["ER"]
    with pytest.raises(client.ConversationEndedError, match="failed with an error"):
        await conn.send(h, "AsyncSent", b"more")
    await conn.end_conversation(h)
    assert await conn.view("conversation_endpoints") == []


async def test_end_with_cleanup_removes_only_local_side(conn: client.Connection) -> None:
    init_svc, target_svc, _init_q, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send(h, "AsyncSent", b"job")
    await conn.end_conversation(h, cleanup=True)
    rows = await conn.view("conversation_endpoints")
    assert [r["is_initiator"] for r in rows] == [False]
    (job,) = await conn.receive(target_q, timeout=5)
    assert job.message_body == b"job"
    # the target's far side is gone: ending it closes it at once
    await conn.end_conversation(job.conversation_handle)
    assert await conn.view("conversation_endpoints") == []


async def test_end_conversation_discards_unreceived_messages(conn: client.Connection) -> None:
    init_svc, target_svc, init_q, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send_many(h, "AsyncSent", [b"1", b"2"])
    (first,) = await conn.receive(target_q, top=1, timeout=5)
    await conn.send(first.conversation_handle, "AsyncDone", b"reply")
    await conn.end_conversation(h)  # the reply waiting in the initiator queue goes
    assert await conn.peek(init_q) == []
    rest = await conn.receive(target_q, timeout=5)
    assert [m.message_body for m in rest] == [b"2", b""]
    assert rest[1].message_type_name == client.END_DIALOG


async def test_conversation_timer_delivers_dialog_timer(conn: client.Connection) -> None:
    init_svc, target_svc, init_q, _ = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.begin_conversation_timer(h, timeout=0.2)
    (timer,) = await conn.receive(init_q, timeout=10)
    assert timer.message_type_name == client.DIALOG_TIMER
    assert timer.conversation_handle == h
    await conn.end_conversation(h)


async def test_lifetime_expiry_errors_both_sides(conn: client.Connection) -> None:
    init_svc, target_svc, init_q, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract", lifetime=1)
    await conn.send(h, "AsyncSent", b"x")
    (initiator_error,) = await conn.receive(init_q, timeout=10)
    assert initiator_error.message_type_name == client.ERROR
    assert b"exceeded the lifetime" in initiator_error.message_body
    msgs = await conn.receive(target_q, timeout=10)
    types = [m.message_type_name for m in msgs]
    if types == ["AsyncSent"]:  # the error may arrive a moment later
        msgs = await conn.receive(target_q, timeout=10)
        types = [m.message_type_name for m in msgs]
    assert types[-1] == client.ERROR
    assert {r["state"] for r in await conn.view("conversation_endpoints")} == {"ER"}


async def test_related_conversation_joins_group(conn: client.Connection) -> None:
    init_svc, target_svc, _init_q, _ = await seed000(conn)
    a = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    b = await conn.begin_dialog(
        init_svc, target_svc, contract="AsyncContract", related_conversation=a
    )
    group = uuid.uuid4()
    c = await conn.begin_dialog(
        init_svc, target_svc, contract="AsyncContract", related_conversation_group=group
    )
    rows = {
        r["conversation_handle"]: r["conversation_group_id"]
        for r in await conn.view("conversation_endpoints")
    }
    assert rows[a] == rows[b]
    assert rows[c] == group


async def test_move_conversation(conn: client.Connection) -> None:
    init_svc, target_svc, _init_q, target_q = await seed000(conn)
    a = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    b = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send(a, "AsyncSent", b"a")
    await conn.send(b, "AsyncSent", b"b")
    first = (await conn.receive(target_q, timeout=5))[0]
    second_group = None
    for row in await conn.view("conversation_endpoints"):
        if not row["is_initiator"] and row["conversation_handle"] != first.conversation_handle:
            second_group = row["conversation_group_id"]
    assert second_group is not None
    await conn.send(a, "AsyncSent", b"a2")
    await conn.move_conversation(first.conversation_handle, second_group)
    both = await conn.receive(target_q, timeout=5)
    assert sorted(m.message_body for m in both) == [b"a2", b"b"]
    assert {m.conversation_group_id for m in both} == {second_group}


async def test_multi_handle_send_is_atomic(conn: client.Connection) -> None:
    init_svc, target_svc, _init_q, target_q = await seed000(conn)
    a = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    b = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send([a, b], "AsyncSent", b"both")
    got = await conn.receive(target_q, timeout=5)
    got += await conn.receive(target_q, timeout=5)
    assert [m.message_body for m in got] == [b"both", b"both"]
    await conn.end_conversation(b)
    with pytest.raises(client.NotFoundError):
        await conn.send([a, b], "AsyncSent", b"again")
    assert await conn.peek(target_q) != []  # only b's EndDialog is there
    assert all(m.message_type_name == client.END_DIALOG for m in await conn.peek(target_q))


async def test_retention_keeps_received_messages_until_end(conn: client.Connection) -> None:
    await conn.create_queue("Kept", retention="ON")
    await conn.create_queue("From")
    await conn.create_service("KeptService", queue="Kept", contracts=["DEFAULT"])
    await conn.create_service("FromService", queue="From")
    h = await conn.begin_dialog("FromService", "KeptService")
    await conn.send_many(h, "DEFAULT", [b"1", b"2"])
    got = await conn.receive("Kept", timeout=5)
    assert [m.status for m in got] == [1, 1]
    kept = await conn.peek("Kept")
    assert [(m.status, m.message_body) for m in kept] == [(0, b"1"), (0, b"2")]
    assert await conn.receive("Kept", timeout=0) == []
    await conn.end_conversation(got[0].conversation_handle)
    assert await conn.peek("Kept") == []


async def test_default_contract_and_message_type(conn: client.Connection) -> None:
    await conn.create_queue("Q")
    await conn.create_service("S", queue="Q", contracts=["DEFAULT"])
    h = await conn.begin_dialog("S", "S")
    await conn.send(h, body="plain")
    (m,) = await conn.receive("Q", timeout=5)
    assert (m.message_type_name, m.service_contract_name, m.message_body) == (
        "DEFAULT",
        "DEFAULT",
        b"plain",
    )
    await conn.send(m.conversation_handle, body="back")
    (back,) = await conn.receive("Q", timeout=5, conversation_handle=h)
    assert back.message_body == b"back"

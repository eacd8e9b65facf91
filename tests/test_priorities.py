"""Conversation priorities: assignment by the seed-002 precedence table, and RECEIVE order."""

from __future__ import annotations

import pytest

from ssb import client


async def _services(conn: client.Connection) -> None:
    await conn.create_message_type("Request")
    await conn.create_message_type("Reply")
    await conn.create_contract("SimpleContract", {"Request": "INITIATOR", "Reply": "TARGET"})
    await conn.create_contract("OtherContract", {"Request": "INITIATOR", "Reply": "TARGET"})
    await conn.create_queue("InitiatorQueue")
    await conn.create_queue("TargetQueue")
    await conn.create_service("InitiatorService", queue="InitiatorQueue")
    await conn.create_service(
        "TargetService", queue="TargetQueue", contracts=["SimpleContract", "OtherContract"]
    )


async def _levels(conn: client.Connection, handle: object) -> tuple[int, int | None]:
    rows = await conn.view("conversation_endpoints")
    mine = next(r for r in rows if r["conversation_handle"] == handle)
    other = [
        r["priority"]
        for r in rows
        if r["conversation_id"] == mine["conversation_id"] and r is not mine
    ]
    return mine["priority"], (other[0] if other else None)


ROWS = [
    # (contract, local, remote) of the one priority that exists -> applies to initiator?
    ("SimpleContract", "InitiatorService", "TargetService"),
    ("SimpleContract", "InitiatorService", None),
    ("SimpleContract", None, "TargetService"),
    ("SimpleContract", None, None),
    (None, "InitiatorService", "TargetService"),
    (None, "InitiatorService", None),
    (None, None, "TargetService"),
    (None, None, None),
]


async def test_eight_precedence_rows(conn: client.Connection) -> None:
    await _services(conn)
    # all eight shapes exist at once, each with its own level; dialogs prove that the
    # best-matching shape wins, then drop it and the next row takes over
    for level, (contract, local, remote) in zip(range(10, 2, -1), ROWS, strict=True):
        await conn.create_broker_priority(
            f"p{level}", contract=contract, local_service=local, remote_service=remote, level=level
        )
    for level in range(10, 2, -1):
        h = await conn.begin_dialog("InitiatorService", "TargetService", contract="SimpleContract")
        assert (await _levels(conn, h))[0] == level
        await conn.end_conversation(h)
        await conn.drop_broker_priority(f"p{level}")
    h = await conn.begin_dialog("InitiatorService", "TargetService", contract="SimpleContract")
    assert (await _levels(conn, h))[0] == 5
    rows = await conn.view("conversation_priorities")
    assert rows == []


async def test_initiator_10_target_1_example(conn: client.Connection) -> None:
    await _services(conn)
    await conn.create_broker_priority(
        "InitiatorToTarget", "SimpleContract", "InitiatorService", "TargetService", level=10
    )
    await conn.create_broker_priority(
        "TargetToInitiator", "SimpleContract", "TargetService", "InitiatorService", level=1
    )
    h = await conn.begin_dialog("InitiatorService", "TargetService", contract="SimpleContract")
    await conn.send(h, "Request", b"r")
    assert await _levels(conn, h) == (10, 1)
    (request,) = await conn.receive("TargetQueue", timeout=5)
    assert request.priority == 1  # received from the target queue at the target's level
    await conn.send(request.conversation_handle, "Reply", b"x")
    (reply,) = await conn.receive("InitiatorQueue", timeout=5)
    assert reply.priority == 10
    # a later change leaves existing endpoints alone
    await conn.alter_broker_priority("InitiatorToTarget", level=2)
    assert await _levels(conn, h) == (10, 1)
    rows = {r["name"]: r["priority"] for r in await conn.view("conversation_priorities")}
    assert rows == {"InitiatorToTarget": 2, "TargetToInitiator": 1}


async def _leveled_dialogs(conn: client.Connection, levels: list[int]) -> list:
    await conn.create_queue("Inbox")
    await conn.create_queue("Outbox")
    handles = []
    for i, level in enumerate(levels):
        await conn.create_service(f"Target{i}", queue="Inbox", contracts=["DEFAULT"])
        await conn.create_service(f"Sender{i}", queue="Outbox")
        await conn.create_broker_priority(f"lvl{i}", local_service=f"Target{i}", level=level)
    for i, _ in enumerate(levels):
        h = await conn.begin_dialog(f"Sender{i}", f"Target{i}")
        await conn.send_many(h, "DEFAULT", [f"{i}:a", f"{i}:b"])
        handles.append(h)
    return handles


async def test_receive_takes_groups_by_priority(conn: client.Connection) -> None:
    await _leveled_dialogs(conn, [1, 5, 10])
    order = []
    for _ in range(3):
        msgs = await conn.receive("Inbox", timeout=5)
        order.append([m.priority for m in msgs])
    assert order == [[10, 10], [5, 5], [1, 1]]


async def test_locked_high_group_is_skipped(conn: client.Connection) -> None:
    await _leveled_dialogs(conn, [1, 10])
    holder = await client.connect(conn.url)
    try:
        await holder.begin_transaction()
        top = await holder.receive("Inbox", top=1, timeout=5)
        assert top[0].priority == 10
        other = await conn.receive("Inbox", timeout=5)
        assert [m.priority for m in other] == [1, 1]
        assert await conn.get_conversation_group("Inbox", timeout=0) is None
        await holder.rollback()
    finally:
        await holder.close()
    assert [m.priority for m in await conn.receive("Inbox", timeout=5)] == [10, 10]


async def test_equal_levels_oldest_first(conn: client.Connection) -> None:
    handles = await _leveled_dialogs(conn, [5, 5, 5])
    # the first group gets one more message; it still comes first, then the others
    await conn.send(handles[0], "DEFAULT", b"0:c")
    first = await conn.receive("Inbox", top=1, timeout=5)
    assert first[0].message_body == b"0:a"
    # each time, the group whose oldest message has waited longest: a group that keeps
    # receiving new messages does not keep the others waiting
    rest = [(await conn.receive("Inbox", top=1, timeout=5))[0].message_body for _ in range(6)]
    assert rest == [b"0:b", b"1:a", b"1:b", b"2:a", b"2:b", b"0:c"]


async def test_bad_priorities(conn: client.Connection) -> None:
    with pytest.raises(client.InvalidArgumentError, match=r"1\.\.10"):
        await conn.create_broker_priority("p", level=11)
    with pytest.raises(client.NotFoundError):
        await conn.alter_broker_priority("missing", level=3)

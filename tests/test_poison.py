"""Poison messages: Service Broker's queue disable and the per-queue poison policies."""

from __future__ import annotations

import pytest
from daemon import BrokerProcess

from ssb import client


async def _setup(conn: client.Connection, **queue_options: object) -> None:
    await conn.create_queue("Replies")
    await conn.create_queue("Events")
    await conn.create_service("Client", queue="Replies")
    await conn.create_service(
        "EventService", queue="Events", contracts=[client.POST_EVENT_NOTIFICATION]
    )
    await conn.create_queue("Work", **queue_options)
    await conn.create_service("WorkService", queue="Work", contracts=["DEFAULT"])


async def _fail(
    conn: client.Connection, queue: str, times: int, error: str = "boom"
) -> list[client.Message]:
    seen: list[client.Message] = []
    for _ in range(times):
        await conn.begin_transaction()
        got = await conn.receive(queue, top=1, timeout=5)
        assert got, "nothing to receive"
        seen += got
        await conn.rollback(error=error)
    return seen


async def test_five_rollbacks_disable_the_queue_and_notify(conn: client.Connection) -> None:
    await _setup(conn)
    await conn.create_event_notification(
        "WorkDisabled", event="BROKER_QUEUE_DISABLED", queue="Work", service="EventService"
    )
    h = await conn.begin_dialog("Client", "WorkService")
    await conn.send(h, body="poison")
    assert await conn.view("poison_messages") == []
    seen = await _fail(conn, "Work", 5)
    assert [m.delivery_count for m in seen] == [1, 2, 3, 4, 5]
    with pytest.raises(client.QueueDisabledError, match=r"poison message detected after 5"):
        await conn.receive("Work")
    (incident,) = await conn.view("poison_messages")
    assert (incident["queue"], incident["action"], incident["delivery_count"]) == (
        "Work",
        "queue_disabled",
        5,
    )
    assert incident["queuing_order"] == seen[-1].queuing_order and incident["error"] == "boom"
    (event,) = await conn.receive("Events", timeout=5)
    assert event.message_type_name == client.EVENT_NOTIFICATION
    assert b"<EventType>BROKER_QUEUE_DISABLED</EventType>" in event.message_body
    assert b"<ObjectName>Work</ObjectName>" in event.message_body
    (row,) = [q for q in await conn.view("service_queues") if q["name"] == "Work"]
    assert row["is_receive_enabled"] is False and "poison" in row["disabled_reason"]
    await conn.alter_queue("Work", status="ON")
    (again,) = await conn.receive("Work", timeout=5)
    assert (again.message_body, again.delivery_count) == (b"poison", 6)


async def test_poison_handling_off_never_disables(conn: client.Connection) -> None:
    await _setup(conn, poison_message_handling={"status": "OFF"})
    await conn.create_event_notification(
        "WorkDisabled", event="BROKER_QUEUE_DISABLED", queue="Work", service="EventService"
    )
    h = await conn.begin_dialog("Client", "WorkService")
    await conn.send(h, body="poison")
    await _fail(conn, "Work", 7)
    assert len(await conn.receive("Work", timeout=5)) == 1
    assert await conn.receive("Events", timeout=0) == []


async def test_a_commit_resets_the_count(conn: client.Connection) -> None:
    await _setup(conn)
    h = await conn.begin_dialog("Client", "WorkService")
    await conn.send_many(h, "DEFAULT", [b"a", b"b"])
    await _fail(conn, "Work", 4)
    async with conn.transaction():
        assert len(await conn.receive("Work", top=1, timeout=5)) == 1
    await _fail(conn, "Work", 4)
    assert [m.message_body for m in await conn.receive("Work", timeout=5)] == [b"b"]


async def _neighbours(conn: client.Connection) -> tuple:
    bad = await conn.begin_dialog("Client", "WorkService")
    good = await conn.begin_dialog("Client", "WorkService")
    await conn.send(bad, body="bad")
    await conn.send_many(good, "DEFAULT", [b"g1", b"g2", b"g3"])
    return bad, good


async def _drain_good(conn: client.Connection) -> list[bytes]:
    bodies = []
    while True:
        got = await conn.receive("Work", timeout=0.2)
        if not got:
            return bodies
        bodies += [m.message_body for m in got if m.message_type_name == "DEFAULT"]


async def test_dead_letter_policy(conn: client.Connection) -> None:
    await conn.create_queue("DLQ")
    await _setup(
        conn,
        poison_policy={
            "threshold": 3,
            "action": "dead_letter",
            "dead_letter_queue": "DLQ",
            "notify_service": "EventService",
        },
    )
    _bad, _good = await _neighbours(conn)
    seen = await _fail(conn, "Work", 3, error="ValueError: cannot parse 'bad'")
    assert all(m.message_body == b"bad" for m in seen)
    assert await _drain_good(conn) == [b"g1", b"g2", b"g3"]
    (letter,) = await conn.peek("DLQ")
    assert letter.message_body == b"bad" and letter.service_name == "WorkService"
    assert letter.delivery_count == 3 and "cannot parse" in (letter.dead_letter_reason or "")
    (incident,) = await conn.view("poison_messages")
    assert (incident["queue"], incident["action"], incident["delivery_count"]) == (
        "Work",
        "dead_letter",
        3,
    )
    assert "cannot parse" in incident["error"]
    (note,) = await conn.receive("Events", timeout=5)
    assert b"<EventType>POISON_MESSAGE</EventType>" in note.message_body
    # an admin puts it back; it is delivered again on its conversation
    await conn.requeue_dead_letter("DLQ", letter.queuing_order)
    assert await conn.peek("DLQ") == []
    (back,) = await conn.receive("Work", timeout=5)
    assert (back.message_body, back.conversation_handle) == (b"bad", seen[0].conversation_handle)


async def test_end_conversation_policy(conn: client.Connection) -> None:
    await _setup(
        conn,
        poison_policy={
            "threshold": 2,
            "action": "end_conversation",
            "error_code": 77,
            "description": "unprocessable",
        },
    )
    bad, _good = await _neighbours(conn)
    seen = await _fail(conn, "Work", 2)
    target_handle = seen[0].conversation_handle
    msgs = await conn.receive("Work", timeout=5)
    bodies = [m.message_body for m in msgs]
    rest = await _drain_good(conn)
    errors = [m for m in msgs if m.message_type_name == client.ERROR]
    if errors:  # the target side's own Error came first
        assert errors[0].conversation_handle == target_handle
        assert rest == [b"g1", b"g2", b"g3"]
    else:
        assert bodies + rest == [b"g1", b"g2", b"g3"]
    (initiator_error,) = await conn.receive("Replies", timeout=5, conversation_handle=bad)
    assert initiator_error.message_type_name == client.ERROR
    assert b"<Code>77</Code>" in initiator_error.message_body
    assert (await conn.view("poison_messages"))[0]["action"] == "end_conversation"


async def test_park_policy_redelivers_after_delay_then_dead_letters(
    conn: client.Connection,
) -> None:
    await conn.create_queue("DLQ")
    await _setup(
        conn,
        poison_policy={
            "threshold": 1,
            "action": "park",
            "delay": 0.3,
            "max_parks": 1,
            "dead_letter_queue": "DLQ",
        },
    )
    bad, _good = await _neighbours(conn)
    await _fail(conn, "Work", 1)
    # while parked, the neighbours flow
    async with conn.transaction():
        got = await conn.receive("Work", timeout=5)
    assert [m.message_body for m in got] == [b"g1", b"g2", b"g3"]
    (parked_again,) = await conn.receive("Work", timeout=10)
    assert parked_again.message_body == b"bad" and parked_again.delivery_count == 2
    # that receive committed; send a second bad one which exceeds max_parks
    await conn.send(bad, body="bad2")
    await _fail(conn, "Work", 1)  # parked once
    (retry,) = await _fail_once_after_park(conn)
    assert retry.message_body == b"bad2"
    (letter,) = await conn.peek("DLQ")
    assert letter.message_body == b"bad2"
    actions = [i["action"] for i in await conn.view("poison_messages")]
    assert actions == ["park", "park", "dead_letter"]


async def _fail_once_after_park(conn: client.Connection) -> list[client.Message]:
    await conn.begin_transaction()
    got = await conn.receive("Work", top=1, timeout=10)
    await conn.rollback(error="still bad")
    return got


async def test_record_policy_only_records(conn: client.Connection) -> None:
    await _setup(
        conn,
        poison_policy={"threshold": 2, "action": "record"},
        poison_message_handling={"status": "OFF"},
    )
    _bad, _good = await _neighbours(conn)
    await _fail(conn, "Work", 3)
    assert [i["action"] for i in await conn.view("poison_messages")] == ["record"]
    assert b"bad" in [m.message_body for m in await conn.peek("Work")]


async def test_delivery_count_and_dead_letters_survive_kill_9(broker: BrokerProcess) -> None:
    conn = await client.connect(broker.url)
    await conn.create_queue("DLQ")
    await _setup(
        conn,
        poison_policy={"threshold": 3, "action": "dead_letter", "dead_letter_queue": "DLQ"},
    )
    bad, _good = await _neighbours(conn)
    await _fail(conn, "Work", 3)
    await conn.end_conversation(bad)  # the dead letter outlives its conversation
    await conn.begin_transaction()
    (_g1,) = await conn.receive("Work", top=1, timeout=5)
    await conn.rollback()
    broker.kill()
    broker.start()
    conn = await client.connect(broker.url)
    (letter,) = await conn.peek("DLQ")
    assert letter.message_body == b"bad" and letter.dead_letter_reason
    got = await conn.receive("Work", top=1, timeout=5)
    assert [(m.message_body, m.delivery_count) for m in got] == [(b"g1", 2)]
    assert [i["action"] for i in await conn.view("poison_messages")] == ["dead_letter"]
    await conn.close()

"""Bad input gets a stable code and words a person can act on; nothing is half-applied."""

from __future__ import annotations

import pytest
from setup_objects import seed000

from ssb import client
from ssb.protocol import ErrorCode
from ssb.tools import wait_until


async def test_unknown_objects(conn: client.Connection) -> None:
    with pytest.raises(client.NotFoundError) as info:
        await conn.begin_dialog("Nope", "Nope")
    assert info.value.code == ErrorCode.UNKNOWN_SERVICE
    assert "service 'Nope' does not exist" in info.value.message
    await seed000(conn)
    # a target no route leads to is not refused (Service Broker's way): its messages wait,
    # saying why
    typo = await conn.begin_dialog("ServiceAsyncInitiator", "Typo", contract="AsyncContract")
    await conn.send(typo, "AsyncSent", b"waits")
    (row,) = await conn.view("transmission_queue")
    assert row["to_service_name"] == "Typo"
    assert row["transmission_status"] == "no route to service 'Typo'"
    await conn.end_conversation(typo, cleanup=True)
    assert await conn.view("transmission_queue") == []
    with pytest.raises(client.NotFoundError, match="contract 'Nope'"):
        await conn.begin_dialog("ServiceAsyncInitiator", "ServiceAsyncTarget", contract="Nope")
    with pytest.raises(client.NotFoundError) as info:
        await conn.receive("NoQueue")
    assert info.value.code == ErrorCode.UNKNOWN_QUEUE


async def test_a_route_that_leads_nowhere_says_what_to_do(conn: client.Connection) -> None:
    """A route exists but cannot take the messages: a LOCAL route to a service this
    broker lacks, a TRANSPORT route for a name that is no address. The status says so
    (not "no route", which sends the operator to create one), and the messages go once
    the service exists."""
    await conn.create_queue("InitQ")
    await conn.create_service("Init", queue="InitQ")
    await conn.create_route("ToGhost", "Ghost", address="LOCAL")
    await conn.create_route("Anywhere", "Anything", address="TRANSPORT")
    ghost = await conn.begin_dialog("Init", "Ghost")
    await conn.send(ghost, "DEFAULT", b"for the ghost")
    plain = await conn.begin_dialog("Init", "NoAddress")
    await conn.send(plain, "DEFAULT", b"for no address")

    async def statuses() -> dict[str, str] | None:
        rows = await conn.view("transmission_queue")
        found = {r["to_service_name"]: r["transmission_status"] for r in rows}
        return found if len(found) == 2 and all(found.values()) else None

    found = await wait_until(statuses, "both messages to wait, saying why")
    assert found["Ghost"] == (
        "route 'ToGhost' is LOCAL, but this broker has no service 'Ghost':"
        " create the service here, or alter the route"
    )
    assert found["NoAddress"] == (
        "route 'Anywhere' is TRANSPORT, but the service name 'NoAddress' is no address"
        " (tcp://HOST:PORT): create_route for it"
    )
    await conn.create_queue("GhostQ")
    await conn.create_service("Ghost", queue="GhostQ", contracts=["DEFAULT"])
    (got,) = await conn.receive("GhostQ", timeout=10)
    assert got.message_body == b"for the ghost"


async def test_a_broker_instance_is_a_guid_in_any_case(conn: client.Connection) -> None:
    """SQL Server prints GUIDs in upper case; a dialog to this broker's own instance so
    named is delivered here, and text that is no GUID is refused before anything."""
    await conn.create_queue("InQ")
    await conn.create_service("In", queue="InQ", contracts=["DEFAULT"])
    shouted = str(conn.broker_instance_id).upper()
    handle = await conn.begin_dialog("In", "In", broker_instance=shouted)
    await conn.send(handle, "DEFAULT", b"here")
    (got,) = await conn.receive("InQ", timeout=10)
    assert got.message_body == b"here"
    with pytest.raises(client.BrokerError, match="'not a guid' is not a UUID") as refused:
        await conn.begin_dialog("In", "In", broker_instance="not a guid")
    assert refused.value.code == ErrorCode.BAD_ARGUMENT


async def test_contract_rules(conn: client.Connection) -> None:
    init_svc, target_svc, _init_q, target_q = await seed000(conn)
    with pytest.raises(client.ContractViolationError) as info:
        await conn.begin_dialog(target_svc, init_svc, contract="AsyncContract")
    assert info.value.code == ErrorCode.CONTRACT_NOT_ACCEPTED
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    with pytest.raises(client.ContractViolationError) as info:
        await conn.send(h, "AsyncDone", b"wrong side")
    assert info.value.code == ErrorCode.WRONG_DIRECTION
    assert "sent by the TARGET" in info.value.message
    with pytest.raises(client.ContractViolationError) as info:
        await conn.send(h, "DEFAULT", b"not in contract")
    assert info.value.code == ErrorCode.MESSAGE_TYPE_NOT_IN_CONTRACT
    assert await conn.peek(target_q) == []


async def test_validation(conn: client.Connection) -> None:
    await conn.create_message_type("Xml", validation="WELL_FORMED_XML")
    await conn.create_message_type("Json", validation="VALID_JSON")
    await conn.create_message_type("Nothing", validation="EMPTY")
    await conn.create_contract("C", {"Xml": "ANY", "Json": "ANY", "Nothing": "ANY"})
    await conn.create_queue("Q")
    await conn.create_service("S", queue="Q", contracts=["C"])
    h = await conn.begin_dialog("S", "S", contract="C")
    await conn.send(h, "Xml", b"<a><b/></a>")
    await conn.send(h, "Json", b'{"a": [1, 2]}')
    await conn.send(h, "Nothing", b"")
    with pytest.raises(client.ValidationError, match="WELL_FORMED_XML"):
        await conn.send(h, "Xml", b"<a><b></a>")
    with pytest.raises(client.ValidationError, match="VALID_JSON"):
        await conn.send(h, "Json", b"{nope")
    with pytest.raises(client.ValidationError, match="EMPTY"):
        await conn.send(h, "Nothing", b"x")
    # a batch with one bad body sends nothing at all
    with pytest.raises(client.ValidationError):
        await conn.send_many(h, "Json", [b"1", b"{bad", b"3"])
    got = await conn.receive("Q", timeout=5)
    assert [m.message_type_name for m in got] == ["Xml", "Json", "Nothing"]
    assert [m.validation for m in got] == ["X", "J", "E"]


async def test_send_on_ended_conversation(conn: client.Connection) -> None:
    init_svc, target_svc, _, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send(h, "AsyncSent", b"1")
    (m,) = await conn.receive(target_q, timeout=5)
    await conn.end_conversation(h)
    with pytest.raises(client.NotFoundError, match="has ended"):
        await conn.send(h, "AsyncSent", b"2")
    with pytest.raises(client.ConversationEndedError, match="the far side ended it"):
        await conn.send(m.conversation_handle, "AsyncDone", b"late")


async def test_queue_off_refuses_receive_and_holds_arrivals(conn: client.Connection) -> None:
    init_svc, target_svc, _, target_q = await seed000(conn)
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.alter_queue(target_q, status="OFF")
    with pytest.raises(client.QueueDisabledError, match=r"STATUS = OFF.*alter_queue"):
        await conn.receive(target_q)
    await conn.send_many(h, "AsyncSent", [b"1", b"2", b"3"])
    waiting = await conn.view("transmission_queue")
    assert [r["message_sequence_number"] for r in waiting] == [0, 1, 2]
    assert all("disabled" in r["transmission_status"] for r in waiting)
    await conn.alter_queue(target_q, status="ON")
    assert await conn.view("transmission_queue") == []
    got = await conn.receive(target_q, timeout=5)
    assert [m.message_body for m in got] == [b"1", b"2", b"3"]


async def test_drop_rules(conn: client.Connection) -> None:
    init_svc, target_svc, init_q, target_q = await seed000(conn)
    with pytest.raises(client.InUseError, match="used by service ServiceAsyncTarget"):
        await conn.drop_queue(target_q)
    with pytest.raises(client.InUseError):
        await conn.drop_message_type("AsyncSent")
    with pytest.raises(client.InvalidArgumentError, match="system object"):
        await conn.drop_contract("DEFAULT")
    h = await conn.begin_dialog(init_svc, target_svc, contract="AsyncContract")
    await conn.send(h, "AsyncSent", b"1")
    # as Service Broker drops a service: its conversations end with an error to the far side
    await conn.drop_service(init_svc)
    got = await conn.receive(target_q, timeout=5)
    assert [m.message_type_name for m in got] == ["AsyncSent", client.ERROR]
    assert b"<Code>-8490</Code>" in got[1].message_body
    assert b"ServiceAsyncInitiator" in got[1].message_body
    await conn.end_conversation(got[0].conversation_handle)
    assert await conn.view("conversation_endpoints") == []
    await conn.drop_queue(init_q)
    names = [r["name"] for r in await conn.view("service_queues")]
    assert names == [target_q]
    with pytest.raises(client.AlreadyExistsError):
        await conn.create_queue(target_q)


async def test_bad_arguments(conn: client.Connection) -> None:
    with pytest.raises(client.InvalidArgumentError, match="validation must be one of"):
        await conn.create_message_type("M", validation="MAYBE")
    with pytest.raises(client.InvalidArgumentError, match="INITIATOR, TARGET or ANY"):
        await conn.create_message_type("M")
        await conn.create_contract("C", {"M": "SOMEONE"})
    with pytest.raises(client.InvalidArgumentError, match="'ON' or 'OFF'"):
        await conn.create_queue("Q", status="MAYBE")
    # a name without ':' is a T-SQL stored procedure's, which must exist
    with pytest.raises(client.NotFoundError, match=r"package\.module:function"):
        await conn.create_queue("Q", activation={"status": "ON", "procedure": "nocolon"})
    await conn.create_queue("Q")
    with pytest.raises(client.InvalidArgumentError, match="top must be a positive integer"):
        await conn.receive("Q", top=0)
    with pytest.raises(client.InvalidArgumentError, match=r"does not take|unexpected keyword"):
        await conn.call(client._calls.Call("receive", {"queue": "Q", "bogus": 1}, list))
    with pytest.raises(client.ProtocolViolationError, match="unknown operation"):
        await conn.call(client._calls.Call("frobnicate", {}, list))
    assert await conn.ping() == "pong"  # the session goes on

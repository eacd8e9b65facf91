"""ALTER MESSAGE TYPE and ALTER SERVICE (ADD / DROP CONTRACT) on a real broker."""

from __future__ import annotations

import pytest

from ssb import client


async def test_alter_message_type_validates_what_is_sent_from_now_on(
    conn: client.Connection,
) -> None:
    await conn.create_message_type("M", validation="NONE")
    await conn.create_contract("C", {"M": "INITIATOR"})
    await conn.create_queue("Q")
    await conn.create_service("T", queue="Q", contracts=["C"])
    await conn.create_service("I", queue="Q")
    handle = await conn.begin_dialog("I", "T", contract="C")
    await conn.send(handle, "M", b"not xml")
    await conn.alter_message_type("M", "WELL_FORMED_XML")
    assert [m["validation"] for m in await conn.view("message_types") if m["name"] == "M"] == [
        "WELL_FORMED_XML"
    ]
    with pytest.raises(client.ValidationError):
        await conn.send(handle, "M", b"not xml")
    assert len(await conn.receive("Q", timeout=5.0)) == 1  # what was queued keeps its own
    with pytest.raises(client.InvalidArgumentError, match="system object"):
        await conn.alter_message_type("DEFAULT", "EMPTY")
    with pytest.raises(client.NotFoundError):
        await conn.alter_message_type("nope", "EMPTY")


async def test_alter_service_adds_and_drops_contracts(conn: client.Connection) -> None:
    await conn.create_message_type("M", validation="NONE")
    await conn.create_contract("C1", {"M": "INITIATOR"})
    await conn.create_contract("C2", {"M": "INITIATOR"})
    await conn.create_queue("Q")
    await conn.create_service("T", queue="Q", contracts=["C1"])
    await conn.create_service("I", queue="Q")
    await conn.alter_service("T", add_contracts=["C2"], drop_contracts=["C1"])
    (target,) = [s for s in await conn.view("services") if s["name"] == "T"]
    assert target["contracts"] == "C2"
    handle = await conn.begin_dialog("I", "T", contract="C2")
    await conn.send(handle, "M", b"x")
    assert len(await conn.receive("Q", timeout=5.0)) == 1
    with pytest.raises(client.NotFoundError, match="does not accept contract 'C1'"):
        await conn.alter_service("T", drop_contracts=["C1"])
    with pytest.raises(client.AlreadyExistsError):
        await conn.alter_service("T", add_contracts=["C2"])
    with pytest.raises(client.NotFoundError):
        await conn.alter_service("T", add_contracts=["nope"])

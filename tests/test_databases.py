"""Databases and stored procedures on a live daemon, from Python: connect(database=), USE
kept across a reconnect, who may create, own and execute what, and what outlives a
restart."""

from __future__ import annotations

import pytest
from daemon import BrokerProcess
from setup_objects import new_logins

from ssb import client

PASSWORD = "a-long-password"


async def test_a_session_starts_in_the_database_it_names_and_keeps_it(
    broker: BrokerProcess,
) -> None:
    async with await client.connect(broker.url) as admin:
        assert admin.database == "master"
        await admin.create_database("Sales")
        await admin.create_queue("Q")  # master's
    with pytest.raises(client.NotFoundError, match="database 'Nowhere' does not exist"):
        await client.connect(broker.url, database="Nowhere")
    with_database = await client.connect(broker.url, database="sales")
    assert with_database.database == "Sales"
    await with_database.close()
    conn = await client.connect(broker.url)
    assert await conn.use("sales") == "Sales"
    await conn.create_queue("Q")  # the same name, in another database
    await conn.create_service("S", queue="Q", contracts=["DEFAULT"])
    rows = {(q["database"], q["name"]) for q in await conn.view("service_queues")}
    assert rows == {("master", "Q"), ("Sales", "Q")}
    handle = await conn.begin_dialog("S", "S")
    await conn.send(handle, "DEFAULT", b"before")
    broker.restart()  # kill -9: the client reconnects, into the same database
    await conn.send(handle, "DEFAULT", b"after")
    got = await conn.receive("Q", timeout=5)
    assert [m.message_body for m in got] == [b"before", b"after"]
    assert await conn.use("MASTER") == "master"
    assert await conn.receive("Q") == []  # master's queue Q is another queue
    await conn.close()
    blocking = client.connect_sync(broker.url, database="Sales")
    try:
        assert blocking.database == "Sales"
        assert blocking.view("databases")[1]["name"] == "Sales"
    finally:
        blocking.close()


async def test_database_owners_and_execute_on_procedures(broker: BrokerProcess) -> None:
    async with new_logins(broker, PASSWORD, "owner", "app") as (admin, owner, app):
        with pytest.raises(client.PermissionDeniedError, match="lacks CREATE on the broker"):
            await owner.create_database("Shop")
        await admin.grant("CREATE", "owner")
        await admin.grant("CREATE", "app")
        await owner.create_database("Shop")
        for conn in (owner, app):
            await conn.use("Shop")
        # the owner of a database holds every permission on what others make in it
        await app.create_queue("AppQueue")
        await owner.alter_queue("AppQueue", status="OFF")
        text = "CREATE PROCEDURE Work AS PRINT 1"
        await owner.create_procedure("Work", text)
        with pytest.raises(client.PermissionDeniedError, match="EXECUTE on procedure 'Work'"):
            await app.procedure("work")
        await owner.grant("EXECUTE", "app", "procedure", "WORK")
        assert await app.procedure("work") == {"name": "Work", "text": text}
        with pytest.raises(client.PermissionDeniedError, match="ALTER on procedure"):
            await app.alter_procedure("Work", "ALTER PROCEDURE Work AS PRINT 2")
        # app has no say over the database itself
        with pytest.raises(client.PermissionDeniedError, match="DROP on database 'Shop'"):
            await app.drop_database("Shop")
        await app.use("master")
        await owner.use("master")
        await owner.drop_database("shop")
        assert [d["name"] for d in await admin.view("databases")] == ["master"]
        grants = [g for g in await admin.view("permissions") if g["login"] in ("owner", "app")]
        assert {(g["permission"], g["kind"]) for g in grants} == {("CREATE", None)}


async def test_procedures_and_databases_outlive_a_restart(broker: BrokerProcess) -> None:
    async with await client.connect(broker.url) as conn:
        await conn.create_database("Kept")
        await conn.use("Kept")
        await conn.create_procedure("P", "CREATE PROCEDURE P AS RETURN 7")
        await conn.alter_database("Kept", trustworthy=True)
        guid = (await conn.view("databases"))[1]["service_broker_guid"]
    broker.restart()
    async with await client.connect(broker.url, database="Kept") as conn:
        (kept,) = [d for d in await conn.view("databases") if d["name"] == "Kept"]
        assert (kept["service_broker_guid"], kept["is_trustworthy_on"]) == (guid, True)
        assert (await conn.procedure("p"))["text"] == "CREATE PROCEDURE P AS RETURN 7"
        (row,) = await conn.view("procedures")
        assert (row["database"], row["name"]) == ("Kept", "P")


async def test_a_dialog_begun_before_its_service_exists_waits_in_its_database(
    broker: BrokerProcess,
) -> None:
    """As in master: a service of another database created after BEGIN DIALOG gets what
    waited for it, in order, across a restart."""
    async with await client.connect(broker.url, reconnect=True) as conn:
        await conn.create_database("Sales")
        await conn.use("Sales")
        await conn.create_queue("From")
        await conn.create_service("Asker", queue="From")
        handle = await conn.begin_dialog("Asker", "Later")
        await conn.send(handle, "DEFAULT", b"one")
        broker.restart()  # kill -9: what waits is read back from the store
        await conn.send(handle, "DEFAULT", b"two")
        waiting = await conn.view("transmission_queue")
        assert [r["transmission_status"] for r in waiting] == ["no route to service 'Later'"] * 2
        await conn.create_queue("Q")
        await conn.create_service("Later", queue="Q", contracts=["DEFAULT"])
        got = await conn.receive("Q", timeout=5)
        assert [m.message_body for m in got] == [b"one", b"two"]

"""Permissions in Service Broker's terms on a live daemon: an ordinary login can do only
what it owns or was granted, every refusal names the permission and the object, and
nothing of a refused statement is applied."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from daemon import BrokerProcess
from setup_objects import new_logins

from ssb import client

PASSWORD = "a-long-password"


@pytest.fixture
async def logins(broker: BrokerProcess) -> AsyncIterator[dict[str, client.Connection]]:
    """admin, and two ordinary logins: 'app' (may CREATE) and 'other' (nothing)."""
    async with new_logins(broker, PASSWORD, "app", "other") as (admin, app, other):
        await admin.grant("CREATE", "app")
        await app.create_queue("AppQueue")
        await app.create_service("AppService", queue="AppQueue", contracts=["DEFAULT"])
        yield {"admin": admin, "app": app, "other": other}


async def _count(admin: client.Connection, view: str) -> int:
    return len(await admin.view(view))


async def test_an_ordinary_login_needs_create(logins: dict[str, client.Connection]) -> None:
    other, admin = logins["other"], logins["admin"]
    with pytest.raises(client.PermissionDeniedError, match="lacks CREATE on the broker"):
        await other.create_queue("Mine")
    with pytest.raises(client.PermissionDeniedError, match="CREATE"):
        await other.create_message_type("Mine")
    queues = [q["name"] for q in await admin.view("service_queues")]
    assert "Mine" not in queues


async def test_an_owner_does_everything_to_its_objects_and_others_nothing(
    logins: dict[str, client.Connection],
) -> None:
    app, other, admin = logins["app"], logins["other"], logins["admin"]
    # the owner: dialogs, sends, receives, alters
    async with app.transaction():
        handle = await app.begin_dialog("AppService", "AppService")
        await app.send(handle, "DEFAULT", b"private")
    await app.alter_queue("AppQueue", retention="OFF")

    # another login: every door is shut, and says which permission it lacks
    with pytest.raises(client.PermissionDeniedError, match="RECEIVE on queue 'AppQueue'"):
        await other.receive("AppQueue", top=10)
    with pytest.raises(client.PermissionDeniedError, match="RECEIVE on queue 'AppQueue'"):
        await other.peek("AppQueue")
    with pytest.raises(client.PermissionDeniedError, match="its owner 'app'"):
        await other.send(handle, "DEFAULT", b"injected")
    with pytest.raises(client.PermissionDeniedError):
        await other.end_conversation(handle)
    with pytest.raises(client.PermissionDeniedError, match="DROP on queue 'AppQueue'"):
        await other.drop_queue("AppQueue")
    with pytest.raises(client.PermissionDeniedError, match="ALTER on queue 'AppQueue'"):
        await other.alter_queue("AppQueue", status="OFF")
    with pytest.raises(client.PermissionDeniedError, match="VIEW on the broker"):
        await other.view("conversation_endpoints")
    with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
        await other.create_certificate("rogue", "-----BEGIN CERTIFICATE-----")
    with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
        await other.create_remote_service_binding("b", "Far", "-----BEGIN CERTIFICATE-----")
    with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
        await other.next_broker_certificate()
    with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
        await other.rotate_broker_certificate()
    with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
        await other.create_login("sneaky", PASSWORD)
    with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
        await other.grant("RECEIVE", "other", "queue", "AppQueue")

    # nothing of it was applied
    (message,) = await admin.peek("AppQueue")
    assert message.message_body == b"private"
    (queue,) = [q for q in await admin.view("service_queues") if q["name"] == "AppQueue"]
    assert queue["is_receive_enabled"]
    assert await _count(admin, "conversation_endpoints") == 2


async def test_grants_open_exactly_one_door_and_outlive_a_restart(
    broker: BrokerProcess, logins: dict[str, client.Connection]
) -> None:
    app, other = logins["app"], logins["other"]
    async with app.transaction():
        handle = await app.begin_dialog("AppService", "AppService")
        await app.send(handle, "DEFAULT", b"for other")
    await app.grant("RECEIVE", "other", "queue", "AppQueue")  # the owner may grant
    for change in (other.grant, other.revoke):  # another may neither grant nor revoke
        with pytest.raises(client.PermissionDeniedError, match=f"which {change.__name__} needs"):
            await change("RECEIVE", "other", "queue", "AppQueue")
    (message,) = await other.receive("AppQueue", top=1)
    assert message.message_body == b"for other"
    with pytest.raises(client.PermissionDeniedError, match="DROP"):
        await other.drop_queue("AppQueue")  # RECEIVE is not DROP
    with pytest.raises(client.PermissionDeniedError, match="SEND on service 'AppService'"):
        await other.begin_dialog("AppService", "AppService")  # nor SEND

    for conn in logins.values():
        await conn.close()
    broker.restart()
    async with await client.connect(broker.url_for("other", PASSWORD)) as other:
        assert await other.receive("AppQueue", top=1) == []  # still granted
        rows = await other.view("queue:AppQueue")
        assert rows == []
    async with await client.connect(broker.url_for("app", PASSWORD)) as app:
        await app.revoke("RECEIVE", "other", "queue", "AppQueue")
    async with await client.connect(broker.url_for("other", PASSWORD)) as other:
        with pytest.raises(client.PermissionDeniedError):
            await other.receive("AppQueue", top=1)


async def test_activation_needs_execute_and_cannot_impersonate(
    logins: dict[str, client.Connection],
) -> None:
    app, admin = logins["app"], logins["admin"]
    activation = {"status": "ON", "procedure": "activation_procs:echo", "max_queue_readers": 1}
    with pytest.raises(client.PermissionDeniedError, match="EXECUTE on the broker"):
        await app.alter_queue("AppQueue", activation=activation)
    await admin.grant("EXECUTE", "app")
    await app.alter_queue("AppQueue", activation=activation)  # runs as its owner, app
    with pytest.raises(client.PermissionDeniedError, match="CONTROL"):
        await app.alter_queue("AppQueue", activation={**activation, "execute_as": "admin"})


async def test_a_detached_transaction_belongs_to_its_login(
    logins: dict[str, client.Connection],
) -> None:
    app, other = logins["app"], logins["other"]
    ident = await app.begin_transaction(detached=True)
    await app.detach_transaction()
    assert ident is not None
    with pytest.raises(client.PermissionDeniedError):
        await other.commit_transaction(ident)
    with pytest.raises(client.PermissionDeniedError):
        await other.attach_transaction(ident)
    await app.rollback_transaction(ident)


async def test_dropping_an_object_forgets_its_owner_and_grants(
    logins: dict[str, client.Connection],
) -> None:
    app, admin = logins["app"], logins["admin"]
    await app.grant("RECEIVE", "other", "queue", "AppQueue")
    await app.drop_service("AppService")
    await app.drop_queue("AppQueue")
    rows = await admin.view("permissions")
    assert not [r for r in rows if r["name"] == "AppQueue"]
    await admin.create_queue("AppQueue")  # a new object of the same name is admin's
    with pytest.raises(client.PermissionDeniedError):
        await app.drop_queue("AppQueue")


async def test_public_is_every_login(logins: dict[str, client.Connection]) -> None:
    other, admin = logins["other"], logins["admin"]
    with pytest.raises(client.PermissionDeniedError, match="SEND on service 'AppService'"):
        await admin.grant("RECEIVE", "other", "queue", "AppQueue")
        await other.begin_dialog("AppService", "AppService")
    await admin.grant("SEND", "PUBLIC", "service", "AppService")  # T-SQL's spelling too
    assert await other.begin_dialog("AppService", "AppService")
    assert {"login": "public", "permission": "SEND", "kind": "service"}.items() <= next(
        r for r in await admin.view("permissions") if r["login"] == "public"
    ).items()
    with pytest.raises(client.BrokerError, match="'public' is every login"):
        await admin.create_login("Public", PASSWORD)

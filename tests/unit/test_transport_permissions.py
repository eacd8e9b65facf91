"""Messages from another broker pass a SEND permission check, without a daemon: the login
the sending broker's certificate names (PUBLIC when none) must hold SEND on the service;
otherwise the dialog ends with Service Broker's error 11215 at the sender and nothing of
it reaches the service's queue, the refusal is logged with the broker's id, and the rest of the direction is acknowledged and dropped
(two brokers on an in-memory network, one fake clock; see transport_harness)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ssb.broker._core.catalog import ERROR

from .core_harness import BODY, MTYPE
from .transport_harness import A_ID, B_ID, World, dialog_services

REFUSED = b"<Code>-11215</Code>"


def _brokers(tmp_path: Path) -> tuple[World, object, object]:
    world = World(tmp_path)
    a = world.broker("a", A_ID, "127.0.0.1:7001")
    b = world.broker("b", B_ID, "127.0.0.1:7002", public_send=False)
    a.op("create_certificate", "b", b.certificate)
    dialog_services(a, b)
    a.op("create_route", "to_b", "TargetService", f"tcp://{b.address}")
    b.op("create_route", "to_a", "InitiatorService", f"tcp://{a.address}")
    return world, a, b


async def test_a_broker_whose_login_may_not_send_gets_service_brokers_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world, a, b = _brokers(tmp_path)
    b.op("create_certificate", "a", a.certificate)  # no login: its messages act as PUBLIC
    handle = a.op("begin_dialog", "InitiatorService", "TargetService")
    with caplog.at_level(logging.WARNING):
        a.op("send", handle, "DEFAULT", [b"1", b"2"])
        a.core.flush()
        await world.settle(flush=False)  # refused at B, nothing of it durable there yet
        a.op("send", handle, "DEFAULT", [b"3"])  # a later read: dropped at B
        await world.settle()
    (error,) = a.core.receive_all("Initiator")
    assert error[MTYPE] == ERROR and REFUSED in error[BODY]
    assert (
        b"This message could not be delivered because the login of broker"
        b" aaaaaaaa-0000-4000-8000-000000000001 does not have permission to send to the"
        b" service. Service name: 'TargetService'." in error[BODY]
    )
    assert b.core.receive_all("Target") == []  # nothing of the refused dialog
    assert b.core.engine.endpoints.count_using(service="TargetService") == 0  # nor it
    assert a.transmission_queue() == 0  # acknowledged: the sender does not retry
    said = [r.getMessage() for r in caplog.records if "lacks SEND" in r.getMessage()]
    assert said == [
        f"conversation {a.core.engine.endpoints.get(handle).conversation_id} from broker"
        f" {A_ID} refused: its certificate's login 'public' lacks SEND on service"
        " 'TargetService' (grant('SEND', 'public', 'service', 'TargetService') lets it send)"
    ]

    b.op("grant", "SEND", "public", "service", "TargetService")
    again = a.op("begin_dialog", "InitiatorService", "TargetService")
    a.op("send", again, "DEFAULT", [b"granted"])
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all("Target")] == [b"granted"]


async def test_a_certificate_maps_its_broker_to_a_login_and_its_grants(tmp_path: Path) -> None:
    world, a, b = _brokers(tmp_path)
    b.op("grant", "SEND", "public", "service", "TargetService")
    with pytest.raises(Exception, match="there is no login 'shop'"):
        b.op("create_certificate", "a", a.certificate, login="shop")
    b.logins.add("shop")
    b.op("create_certificate", "a", a.certificate, login="shop")
    assert [r["login"] for r in b.transport.trust.certificates_view()] == ["shop"]
    first = a.op("begin_dialog", "InitiatorService", "TargetService")
    a.op("send", first, "DEFAULT", [b"as shop, through PUBLIC"])
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all("Target")] == [b"as shop, through PUBLIC"]

    b.op("revoke", "SEND", "public", "service", "TargetService")
    refused = a.op("begin_dialog", "InitiatorService", "TargetService")
    a.op("send", refused, "DEFAULT", [b"no grant left"])
    await world.settle()
    assert b.core.receive_all("Target") == []
    assert [row[MTYPE] for row in a.core.receive_all("Initiator")] == [ERROR]

    b.op("grant", "SEND", "shop", "service", "TargetService")
    granted = a.op("begin_dialog", "InitiatorService", "TargetService")
    a.op("send", granted, "DEFAULT", [b"as shop"])
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all("Target")] == [b"as shop"]


async def test_an_error_cannot_open_a_dialog_to_a_service_it_may_not_send_to(
    tmp_path: Path,
) -> None:
    """EndDialog and Error pass without the check only on a dialog the receiving broker
    already has: an Error as the first message of a new dialog is checked like any
    other, and its body never reaches the service's queue."""
    world, a, b = _brokers(tmp_path)
    b.op("create_certificate", "a", a.certificate)
    handle = a.op("begin_dialog", "InitiatorService", "TargetService")
    # A's side fails before it sent anything: its Error is the dialog's first message
    engine = a.core.engine
    engine.delivery.fail_conversation(engine.endpoints.get(handle), 50001, "planted")
    a.core.flush()
    await world.settle()
    assert b.core.receive_all("Target") == []  # the planted Error never arrives
    assert b.core.engine.endpoints.count_using(service="TargetService") == 0


async def test_a_message_for_a_service_not_created_yet_waits_for_it(tmp_path: Path) -> None:
    world, a, b = _brokers(tmp_path)
    b.op("create_certificate", "a", a.certificate)
    a.op("create_route", "to_b_later", "LaterService", f"tcp://{b.address}")
    handle = a.op("begin_dialog", "InitiatorService", "LaterService")
    a.op("send", handle, "DEFAULT", [b"early"])
    await world.settle()
    assert a.transmission_queue() == 0  # B took it, and keeps it
    b.op("create_queue", "Later")
    b.op("create_service", "LaterService", "Later", ["DEFAULT"])
    b.op("grant", "SEND", "public", "service", "LaterService")
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all("Later")] == [b"early"]


async def test_one_broker_acts_as_one_login(tmp_path: Path) -> None:
    """A broker's second certificate (the next one, while its keys rotate) must map it to
    the login its first does: two logins for one broker would leave one unused."""
    _, a, b = _brokers(tmp_path)
    b.logins.add("shop")
    b.op("create_certificate", "a", a.certificate, login="shop")
    following = a.op("next_broker_certificate")
    with pytest.raises(Exception, match="one broker acts as one login"):
        b.op("create_certificate", "a_next", following)
    b.op("create_certificate", "a_next", following, login="shop")
    assert [r["login"] for r in b.transport.trust.certificates_view()] == ["shop", "shop"]


async def test_what_waited_for_a_service_is_checked_when_the_service_comes(
    tmp_path: Path,
) -> None:
    """A message for a service not created yet waits for it; once it exists, the sending
    broker's login needs SEND on it, as on arrival: it waits on, saying so, until a GRANT
    lets it go."""
    world, a, b = _brokers(tmp_path)
    b.op("create_certificate", "a", a.certificate)
    a.op("create_route", "to_b_later", "LaterService", f"tcp://{b.address}")
    handle = a.op("begin_dialog", "InitiatorService", "LaterService")
    a.op("send", handle, "DEFAULT", [b"early", b"also early"])
    await world.settle()
    assert a.transmission_queue() == 0  # B took them, and keeps them
    b.op("create_queue", "Later")
    b.op("create_service", "LaterService", "Later", ["DEFAULT"])  # no grant to PUBLIC
    await world.settle()
    assert b.core.receive_all("Later") == []
    (box,) = b.core.engine.transmission.outboxes.values()
    assert (
        box.status == f"waits for the login of broker {A_ID} to hold SEND on service 'LaterService'"
    )
    b.op("grant", "SEND", "public", "service", "LaterService")
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all("Later")] == [b"early", b"also early"]
    assert a.core.receive_all("Initiator") == []  # nothing refused

"""Routes without a broker instance, without a daemon: the origin asks along the route which
broker hosts the service, the host proves it, a forwarder relays the question and then the
dialog end to end; what cannot work says what to do in the origin's transmission status
and is logged once by the broker that cannot help (three brokers on an in-memory network,
one fake clock; see transport_harness)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from ssb.broker._core.delivery import Outbound
from ssb.protocol import LocatedFrame

from .core_harness import BODY
from .transport_harness import A_ID, B_ID, F_ID, Broker, World


def _trio(world: World, trust_b_on_a: bool = True) -> tuple[Broker, Broker, Broker]:
    """A (InitiatorService) -> F -> B (TargetService); every route names an address only."""
    return world.trio(trust_b_on_a=trust_b_on_a)


def _status(broker: Broker) -> list[str]:
    rows = broker.core.store.read_transmission_page(None, 100)
    return [broker.transport.describe(Outbound.from_row(row)) for row in rows]


async def _send(
    world: World, a: Broker, bodies: list[bytes], to: str = "TargetService"
) -> uuid.UUID:
    """A dialog from A's InitiatorService to service `to`, `bodies` sent on it and the world
    settled: its handle."""
    handle: uuid.UUID = a.op("begin_dialog", "InitiatorService", to)
    a.op("send", handle, "DEFAULT", bodies)
    await world.settle()
    return handle


async def test_a_route_through_a_forwarder_needs_no_broker_instance(tmp_path: Path) -> None:
    world = World(tmp_path, forwarding=True)
    a, f, b = _trio(world)
    handle = await _send(world, a, [b"m%d" % n for n in range(5)])
    got = b.core.receive_all()
    assert [row[BODY] for row in got] == [b"m%d" % n for n in range(5)]
    b.op("send", got[0][4], "DEFAULT", [b"reply"])
    await world.settle()
    assert [row[BODY] for row in a.core.receive_all("Initiator")] == [b"reply"]
    assert a.transmission_queue() == 0 and b.transmission_queue() == 0
    # the dialog is A's and B's, end to end; F only relays it
    ep = a.core.engine.endpoints.get(handle)
    assert ep is not None and ep.far_broker_instance == B_ID
    assert f.core.engine.endpoints.count_using(service="TargetService") == 0
    (relay,) = f.transport.views()["forwarded_conversations"]()
    assert relay["initiator_broker"] == A_ID and relay["target_broker"] == B_ID
    assert a.peer(b).link is None and a.link_to(f) is not None  # B reached through F
    # the answer is kept: another dialog asks nothing more
    questions = a.transport.locator.lookups
    await _send(world, a, [b"again"])
    assert [row[BODY] for row in b.core.receive_all()] == [b"again"]
    assert list(a.transport.locator.lookups) == list(questions) == [("TargetService", f.address)]


async def test_a_forwarder_without_a_route_on_says_what_to_do_and_logs_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(tmp_path, forwarding=True, retry_initial=1.0, retry_max=2.0)
    a, f, b = _trio(world)
    f.op("drop", "route", "to_b")
    handle = a.op("begin_dialog", "InitiatorService", "TargetService")
    with caplog.at_level(logging.WARNING):
        a.op("send", handle, "DEFAULT", [b"waits"])
        await world.advance(10.0)  # asked again and again
    said = (
        f"broker {F_ID} forwards, but no route there leads to service 'TargetService':"
        f" create_route for it on broker {F_ID}"
    )
    assert _status(a) == [said]
    refusals = [r for r in caplog.records if r.name == "ssb.transport" and said in r.getMessage()]
    assert [r.getMessage().split(":")[0] for r in refusals] == [
        "a broker asked where service 'TargetService' is",  # F, once
        "messages for service 'TargetService' wait",  # A, once
    ]
    assert f.core.engine.endpoints.count_using(service="TargetService") == 0
    assert b.queue("Target") == 0
    # the route on F: A asks again (backoff at most retry_max) and the messages go
    f.op("create_route", "to_b", "TargetService", f"tcp://{b.address}")
    await world.advance(world.settings.retry_max)
    assert b.queue("Target") == 1 and a.transmission_queue() == 0


async def test_a_broker_that_does_not_forward_is_where_the_route_ends(tmp_path: Path) -> None:
    """As before brokers could be asked: what a route leads to a non-forwarding broker is
    that broker's, which holds a message for a service it lacks until it has it."""
    world = World(tmp_path, forwarding=False)
    a, f, _ = _trio(world)
    f.op("grant", "SEND", "public")  # on every service, one that is not there yet too
    handle = await _send(world, a, [b"for F"])
    assert a.transmission_queue() == 0 and f.transmission_queue() == 1
    ep = a.core.engine.endpoints.get(handle)
    assert ep is not None and ep.far_broker_instance == F_ID
    f.op("create_queue", "Target")
    f.op("create_service", "TargetService", "Target", ["DEFAULT"])
    assert [row[BODY] for row in f.core.receive_all()] == [b"for F"]


async def test_the_far_broker_is_trusted_only_by_its_own_certificate(tmp_path: Path) -> None:
    world = World(tmp_path, forwarding=True)
    a, f, b = _trio(world, trust_b_on_a=False)
    await _send(world, a, [b"for B only"])
    assert _status(a) == [
        f"service 'TargetService' is at broker {B_ID} (found through {f.address}), whose"
        " certificate is not trusted here: create_certificate with its broker_certificate()"
    ]
    assert b.queue("Target") == 0
    a.op("create_certificate", "b", b.certificate)
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all()] == [b"for B only"]


async def test_an_answer_that_does_not_verify_is_not_believed(tmp_path: Path) -> None:
    """A forwarder that answers for B (B's id, a signature of its own) is not believed."""
    world = World(tmp_path, forwarding=True)
    a, f, b = _trio(world)
    locator = f.transport.locator
    honest = locator._answer

    def forge(frame, came_from):  # type: ignore[no-untyped-def]
        from ssb.protocol import LocatedFrame, sign_location

        key = f.transport.trust.identity.private_key  # F's key, not B's
        proof = sign_location(key, frame.token, frame.service, uuid.UUID(B_ID), frame.origin)
        locator._send(came_from, LocatedFrame(frame.token, frame.service, uuid.UUID(B_ID), proof))
        return None

    locator._answer = forge  # type: ignore[method-assign]
    await _send(world, a, [b"x"])
    assert _status(a) == [
        f"broker {B_ID}'s answer that it hosts service 'TargetService' does not verify with"
        " its certificate; asking again"
    ]
    assert b.queue("Target") == 0
    locator._answer = honest  # type: ignore[method-assign]
    await world.advance(world.settings.retry_initial)
    assert b.queue("Target") == 1


async def test_a_peers_reasons_are_one_line_a_place_and_clipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What an adjacent broker answers is its own text: a thousand answers that no
    broker hosts the service, each with a new reason, make one warning, and the status
    keeps a clipped, printable reason."""
    world = World(tmp_path, forwarding=True)
    a, _, _ = _trio(world)
    await _send(world, a, [b"waits"])
    locator = a.transport.locator
    (lookup,) = locator.lookups.values()
    with caplog.at_level(logging.WARNING):
        for n in range(1000):
            reason = f"nobody here, try {n}\x1b[2J" + "x" * 1000
            locator._result(LocatedFrame(lookup.token, "TargetService", None, None, reason))
    said = [
        r for r in caplog.records if "messages for service 'TargetService' wait" in r.getMessage()
    ]
    assert len(said) == 1
    assert lookup.status.startswith("nobody here, try 999") and "\x1b" not in lookup.status
    assert len(lookup.status) <= 300


async def test_a_lookup_nobody_waits_for_any_more_is_not_asked_again(tmp_path: Path) -> None:
    world = World(tmp_path, forwarding=True)
    a, f, _ = _trio(world)
    a.op("create_route", "to_nowhere", "Nowhere", f"tcp://{f.address}")
    handle = await _send(world, a, [b"for nobody"], to="Nowhere")
    lookups = a.transport.locator.lookups
    assert ("Nowhere", f.address) in lookups  # asked, and asked again while it waits
    await world.advance(30)
    assert ("Nowhere", f.address) in lookups
    a.op("end_conversation", handle, cleanup=True)
    await world.advance(30)
    assert ("Nowhere", f.address) not in lookups
    assert list(lookups) == [] and a.transport.locator.tokens == {}

"""The transport's way out, without a daemon: placement once durable, the in-flight budget,
priority order with the reserve, acks that delete entries and feed more, a sender resumed
after a restart (two brokers on an in-memory network, one fake clock; see
transport_harness)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from ssb.broker._core.catalog import END_DIALOG
from ssb.broker._core.ports import Span
from ssb.broker._core.transmission import Outbound
from ssb.broker._transport import outbound
from ssb.protocol import Direction

from .core_harness import BODY, MTYPE
from .transport_harness import A_ID, B_ID, World

QUEUING_ORDER = 2  # column of a RECEIVE row


def _dialog(world: World, service: str = "TargetService") -> uuid.UUID:
    a = world.brokers[0]
    handle: uuid.UUID = a.op("begin_dialog", "InitiatorService", service, broker_instance=B_ID)
    return handle


async def test_entries_are_placed_once_durable_and_fed_within_the_in_flight_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbound, "IN_FLIGHT_MESSAGES", 4)
    world = World(tmp_path, retry_initial=1.0)
    a, b = world.pair()
    del world.network.listeners[b.address]  # B cannot be reached yet: nothing is acked
    await world.settle()
    a.op("send", _dialog(world), "DEFAULT", [b"%d" % n for n in range(10)])
    await world.settle(flush=False)
    assert uuid.UUID(B_ID) not in a.transport.peers  # not durable: not placed
    assert world.network.attempts == []
    a.core.flush()
    await world.settle(flush=False)
    peer = a.peer(b)
    assert peer.dialog.unacked_messages == 4  # the budget; the rest waits in the queue
    assert a.transmission_queue() == 10
    assert [address for address, _ in world.network.attempts] == [b.address]
    (box,) = a.core.engine.remote.remote_outboxes()
    assert box.count == 6
    (row,) = a.core.store.read_transmission(box.conversation_id, True, Span(0, None, 1, 1 << 20))
    assert a.transport.describe(Outbound.from_row(row)) == f"connection refused by {b.address}"
    world.network.listeners[b.address] = b.transport.links
    await world.advance(1.0)
    assert b.queue("Target") == 10
    assert [row[BODY] for row in b.core.receive_all()] == [b"%d" % n for n in range(10)]
    assert a.transmission_queue() == 0
    assert peer.dialog.unacked_messages == 0 and peer.dialog.unacked_bytes == 0


async def test_a_direction_waits_with_its_reason_until_a_route_and_a_certificate_say_where(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    a = world.broker("a", A_ID, "127.0.0.1:7001")
    b = world.broker("b", B_ID, "127.0.0.1:7002")
    a.op("create_queue", "Initiator")
    a.op("create_service", "InitiatorService", "Initiator")
    b.op("create_queue", "Target")
    b.op("create_service", "TargetService", "Target", ["DEFAULT"])
    b.op("create_certificate", "a", a.certificate)
    a.op("create_route", "to_b", "TargetService", f"tcp://{b.address}", broker_instance=B_ID)
    handle = _dialog(world)
    a.op("drop", "route", "to_b")
    a.op("send", handle, "DEFAULT", [b"hello"])
    await world.settle()
    (box,) = a.core.engine.remote.remote_outboxes()
    assert box.status == "no route to service 'TargetService'"
    a.op("create_route", "to_b", "TargetService", f"tcp://{b.address}", broker_instance=B_ID)
    await world.settle()
    assert box.status.startswith(f"no certificate of broker {B_ID} is trusted here")
    a.op("create_certificate", "b", b.certificate)
    await world.advance(world.settings.retry_initial)  # the handshake failed before
    assert b.queue("Target") == 1
    assert a.transmission_queue() == 0


async def test_a_dialog_begun_before_its_route_exists_waits_saying_so_then_goes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """BEGIN DIALOG to a service no route leads to succeeds (deployment scripts create
    routes later); the wait is logged once for the service, and the messages go as soon
    as a route exists."""
    world = World(tmp_path)
    a, b = world.pair()
    a.op("drop", "route", "to_b")
    first = a.op("begin_dialog", "InitiatorService", "TargetService")
    second = a.op("begin_dialog", "InitiatorService", "TargetService")
    with caplog.at_level(logging.WARNING, "ssb.transport"):
        a.op("send", first, "DEFAULT", [b"1"])
        await world.settle()
        a.op("send", second, "DEFAULT", [b"2"])
        await world.settle()
    said = [r.getMessage() for r in caplog.records if "no route leads to it" in r.getMessage()]
    assert said == [
        "messages for service 'TargetService' wait in the transmission queue: no route leads"
        " to it; they go once one does (create_route)"
    ]
    rows = a.core.store.read_transmission_page(None, 10)
    assert [a.transport.describe(Outbound.from_row(row)) for row in rows] == [
        "no route to service 'TargetService'"
    ] * 2
    a.op("create_route", "to_b", "TargetService", f"tcp://{b.address}")
    await world.settle()
    assert b.queue("Target") == 2 and a.transmission_queue() == 0


async def test_a_later_direction_of_higher_priority_overtakes_a_backlog_from_the_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbound, "IN_FLIGHT_MESSAGES", 4)
    world = World(tmp_path, retry_initial=0.5)  # reconnected within the starvation bound
    a, b = world.pair()
    for name, level in (("Low", 1), ("High", 10)):
        b.op("create_queue", name)
        b.op("create_service", f"{name}Service", name, ["DEFAULT"])
        a.op("create_route", name, f"{name}Service", f"tcp://{b.address}", broker_instance=B_ID)
        a.op("create_broker_priority", name, remote_service=f"{name}Service", level=level)
    a.op("send", _dialog(world), "DEFAULT", [b"warm-up"])
    await world.settle()  # the dialog layer has seen the time: nothing is starved yet
    del world.network.listeners[b.address]
    world.network.cut(b.transport.links)
    a.op("send", _dialog(world, "LowService"), "DEFAULT", [b"low %d" % n for n in range(20)])
    await world.settle()
    a.op("send", _dialog(world, "HighService"), "DEFAULT", [b"high %d" % n for n in range(3)])
    await world.settle()
    # the budget is full of the low direction's backlog: the high one's first entry
    # comes from the reserve, so that the dialog layer can put it first
    assert a.peer(b).dialog.unacked_messages == 5
    world.network.listeners[b.address] = b.transport.links
    await world.advance(a.transport.settings.retry_initial)
    assert (b.queue("Low"), b.queue("High")) == (20, 3)
    first_high = min(row[QUEUING_ORDER] for row in b.core.receive_all("High"))
    first_low = min(row[QUEUING_ORDER] for row in b.core.receive_all("Low"))
    assert first_high < first_low


async def test_an_ack_deletes_the_entry_and_feeds_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbound, "IN_FLIGHT_MESSAGES", 2)
    world = World(tmp_path)
    a, b = world.pair()
    await world.settle()
    a.op("send", _dialog(world), "DEFAULT", [b"%d" % n for n in range(6)])
    a.core.flush()
    await world.settle(flush=False)
    peer = a.peer(b)
    assert b.queue("Target") == 2  # delivered; not acknowledged until B's batch is durable
    assert peer.dialog.unacked_messages == 2 and a.transmission_queue() == 6
    for delivered in (4, 6):
        b.core.flush()  # B's batch is durable: its acks go
        await world.settle(flush=False)
        assert b.queue("Target") == delivered  # the acks freed budget: more were fed
        assert a.transmission_queue() == 8 - delivered  # acknowledged entries deleted
    b.core.flush()
    await world.settle()
    assert a.transmission_queue() == 0
    assert not peer.dialog.unacked_messages


async def _stored_then_sent(world: World, bodies: list[bytes]) -> uuid.UUID:
    """A dialog from A to B whose messages 0 and 1 B stored, and `bodies` after them
    written to the connection and never delivered (A is about to crash); its handle."""
    a, b = world.brokers
    handle = _dialog(world)
    a.op("send", handle, "DEFAULT", [b"0", b"1"])
    await world.settle()
    assert b.queue("Target") == 2 and a.transmission_queue() == 0
    a.op("send", handle, "DEFAULT", bodies)
    a.core.flush()
    world.clock.run_soon()
    assert world.network.pending(a.transport.links)
    return handle


async def test_a_restarted_sender_resumes_with_its_session_key_at_the_first_unacked_message(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    a, b = world.pair()
    await _stored_then_sent(world, [b"2", b"3"])
    await a.restart()
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all()] == [b"0", b"1", b"2", b"3"]
    assert a.transmission_queue() == 0
    peer = a.peer(b)
    assert not peer.dialog.counters.integrity_failures
    assert not b.peer(a).corrupt_fragments  # the same session key as before the crash


async def test_a_restarted_sender_skips_the_numbers_acknowledged_out_of_order(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    a, b = world.pair()
    handle = await _stored_then_sent(world, [b"2", b"3", b"4", b"5"])
    # A crashes after B had acknowledged message 3 alone (its entry went; B holds it)
    endpoint = a.core.engine.endpoints.get(handle)
    assert endpoint is not None
    a.core.store.delete_transmission_seqs(endpoint.conversation_id, True, 3, 3)
    a.core.flush()
    await a.restart()
    await world.settle()
    # 4 and 5 keep their numbers (taken as 3, B would deliver them next): B holds them
    # behind the 3 it never got here, acknowledges them, and A's queue empties
    assert [row[BODY] for row in b.core.receive_all()] == [b"0", b"1", b"2"]
    assert a.transmission_queue() == 0
    assert a.peer(b).dialog.unacked_messages == 0


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
async def test_a_sender_whose_end_dialog_was_acknowledged_first_goes_with_its_last_message(
    tmp_path: Path, restarted: bool
) -> None:
    world = World(tmp_path, retry_initial=1.0)
    a, b = world.pair()
    handle = await _stored_then_sent(world, [b"2"])
    endpoint = a.core.engine.endpoints.get(handle)
    assert endpoint is not None
    persisted = (endpoint.conversation_id.bytes, int(Direction.FROM_INITIATOR), "send")
    (pipe,) = [p for p in world.network.pipes if p.sent and p.protocol.links is a.transport.links]
    pipe.sent.clear()  # message 2 is lost on the way
    a.op("end_conversation", handle)
    await world.settle()
    # B holds the EndDialog behind the 2 it never got and acknowledges it: A's endpoint
    # goes while message 2 is unacknowledged
    assert a.core.engine.endpoints.get(handle) is None
    assert a.transmission_queue() == 1 and a.peer(b).dialog.unacked_messages == 1
    assert persisted in [tuple(row[:3]) for row in a.core.store.load_remote()[0]]
    if restarted:  # the sender comes back from its persisted state, with no endpoint
        await a.restart()
    await world.advance(2.0)  # A retransmits message 2
    received = b.core.receive_all()
    assert [row[BODY] for row in received] == [b"0", b"1", b"2", b""]
    assert received[-1][MTYPE] == END_DIALOG
    assert a.transmission_queue() == 0
    # nothing is left to send: the sender went too, and its persisted state
    assert a.peer(b).dialog.sender(endpoint.conversation_id, Direction.FROM_INITIATOR) is None
    assert persisted not in [tuple(row[:3]) for row in a.core.store.load_remote()[0]]

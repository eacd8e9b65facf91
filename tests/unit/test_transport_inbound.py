"""The transport's way in, without a daemon: fragments refused while the target queue or the
disk is full, no ack before the store batch is durable, a receiver restored from its
next sequence number and held fragments (two brokers on an in-memory network, one fake
clock; see transport_harness)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from ssb.broker._transport import pump

from .core_harness import BODY, MTYPE
from .transport_harness import B_ID, Broker, World


def _send(a: Broker, bodies: list[bytes], handle: uuid.UUID | None = None) -> uuid.UUID:
    if handle is None:
        handle = a.op("begin_dialog", "InitiatorService", "TargetService", broker_instance=B_ID)
    a.op("send", handle, "DEFAULT", bodies)
    assert handle is not None
    return handle


async def _settled_pair(tmp_path: Path) -> tuple[World, Broker, Broker]:
    """Brokers A and B (`World.pair`), A retransmitting after a second, settled: nothing
    left to run or to move (`World.settle`)."""
    world = World(tmp_path, retry_initial=1.0)
    a, b = world.pair()
    await world.settle()
    return world, a, b


async def test_fragments_for_a_full_queue_are_dropped_unacknowledged_and_come_again(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, retry_initial=1.0)
    a, b = world.pair()
    b.op("alter_queue", "Target", max_messages=2)
    await world.settle()
    _send(a, [b"%d" % n for n in range(5)])
    await world.settle()
    assert b.queue("Target") == 2  # the rest of the read was refused, message by message
    assert b.peer(a).refused_fragments == 3
    assert a.transmission_queue() == 3  # never acknowledged: A keeps them
    assert [row[BODY] for row in b.core.receive_all()] == [b"0", b"1"]
    await world.advance(1.0)  # A retransmits; the queue has room again
    assert b.queue("Target") == 2
    await world.advance(2.0)
    assert [row[BODY] for row in b.core.receive_all()] == [b"2", b"3"]
    await world.advance(4.0)
    assert [row[BODY] for row in b.core.receive_all()] == [b"4"]
    assert a.transmission_queue() == 0


async def test_fragments_are_dropped_unacknowledged_while_the_disk_is_full(
    tmp_path: Path,
) -> None:
    world, a, b = await _settled_pair(tmp_path)
    capacity = b.core.engine.capacity
    capacity.measured(0, "the test's disk")
    _send(a, [b"kept"])
    await world.advance(3.0)  # sent, retransmitted, refused each time
    assert b.queue("Target") == 0
    assert b.peer(a).refused_fragments >= 2
    assert a.transmission_queue() == 1
    capacity.measured(1 << 40, "the test's disk")
    await world.advance(4.0)
    assert [row[BODY] for row in b.core.receive_all()] == [b"kept"]
    assert a.transmission_queue() == 0


async def test_a_full_disk_refusing_many_dialogs_is_one_log_line_not_one_per_dialog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk is this broker's, not a dialog's: while it refuses, what another broker
    sends on many dialogs is logged once a REFUSAL_LOG_EVERY, not once per dialog (each
    retransmitting every minute would write thousands of lines onto the full disk)."""
    world, a, b = await _settled_pair(tmp_path)
    b.core.engine.capacity.measured(0, "the test's disk")
    caplog.set_level(logging.INFO, logger="ssb.transport")
    for _ in range(20):
        _send(a, [b"kept"])
    await world.advance(3.0)  # sent, retransmitted, refused each time
    assert b.peer(a).refused_fragments >= 40
    said = [r.getMessage() for r in caplog.records if "not acknowledging" in r.getMessage()]
    assert len(said) == 1, said
    assert "free disk space" in said[0] and "(they retry)" in said[0]
    b.core.engine.capacity.measured(1 << 40, "the test's disk")
    await world.advance(4.0)
    assert len(b.core.receive_all()) == 20


async def test_no_ack_leaves_before_the_batch_holding_the_message_is_durable(
    tmp_path: Path,
) -> None:
    world, a, b = await _settled_pair(tmp_path)
    _send(a, [b"once"])
    a.core.flush()
    await world.advance(5.0, flush=False)  # retransmitted, and the ack delay long past
    assert b.queue("Target") == 1
    assert a.peer(b).dialog.unacked_messages == 1
    assert a.transmission_queue() == 1  # (commits A's own batch, not B's)
    b.core.flush()
    await world.settle(flush=False)
    assert a.transmission_queue() == 0 and not a.peer(b).dialog.unacked_messages
    assert [row[BODY] for row in b.core.receive_all()] == [b"once"]  # retransmissions dropped


async def test_a_restarted_receiver_resumes_from_its_next_seq_and_held_fragments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(tmp_path, fragment_size=1024)
    a, b = world.pair()
    handle = _send(a, [b"first"])
    await world.settle()
    monkeypatch.setattr(pump, "SEND_BATCH", 1)  # a write per fragment
    big = bytes(range(256)) * 20  # 5 fragments
    _send(a, [big], handle)
    a.core.flush()
    world.clock.run_soon()
    assert world.network.pending(a.transport.links) == 5
    assert world.network.transfer(limit=2) == 2  # two fragments arrive, then B crashes
    b.core.flush()  # they are held in B's store
    await b.restart()
    (partial,) = b.transport.partials()
    assert (partial.message.fragments_received, partial.message.fragment_count) == (2, 5)
    assert partial.queue == "Target"
    await world.settle()  # A reconnects and retransmits
    assert [row[BODY] for row in b.core.receive_all()] == [b"first", big]
    assert b.core.store.load_remote()[1] == []  # no fragment held any more
    assert a.transmission_queue() == 0


async def _one_dialog(tmp_path: Path) -> tuple[World, Broker, Broker, uuid.UUID]:
    """Brokers A and B with a dialog from A whose first message B has stored and acked."""
    world = World(tmp_path)
    a, b = world.pair()
    handle = _send(a, [b"first"])
    await world.settle()
    return world, a, b, handle


def _recorded(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[tuple[Any, ...]]:
    """The arguments of every call of `owner.name` from now on (which still does its work)."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(owner, name)

    def recording(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(owner, name, recording)
    return calls


def _reads_in_one_open_batch(world: World, a: Broker, handle: uuid.UUID, count: int) -> None:
    """`count` messages from A, each in a write of its own and so a read of its own on B,
    whose store commits none of them."""
    for n in range(count):
        _send(a, [b"%d" % n], handle)
        a.core.flush()
        world.clock.run_soon()
        assert world.network.transfer(limit=1) == 1
        world.clock.run_soon()


async def test_a_batch_of_many_reads_writes_each_directions_next_seq_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, a, b, handle = await _one_dialog(tmp_path)
    written = _recorded(monkeypatch, b.core.store, "set_remote_next_seq")
    _reads_in_one_open_batch(world, a, handle, 4)
    assert b.queue("Target") == 5 and written == []
    b.core.flush()
    assert [(direction, seq) for _, direction, _, seq in written] == [(0, 5)]  # the last, once
    await b.restart()
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all()] == [b"first", b"0", b"1", b"2", b"3"]
    assert a.transmission_queue() == 0


async def test_the_dialog_layer_learns_once_per_batch_what_its_reads_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, a, b, handle = await _one_dialog(tmp_path)
    told = _recorded(monkeypatch, b.peer(a).dialog, "mark_stored")
    _reads_in_one_open_batch(world, a, handle, 4)
    assert told == []  # nothing is durable yet
    b.core.flush()
    # once, with the last message: its ack covers the earlier ones
    assert [[event.seq for event in events] for events, _ in told] == [[4]]
    await world.settle()
    assert a.transmission_queue() == 0
    assert [row[BODY] for row in b.core.receive_all()] == [b"first", b"0", b"1", b"2", b"3"]


async def test_a_body_this_broker_finds_invalid_ends_the_dialog_and_what_follows_goes_nowhere(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    a, b = world.pair()
    for broker, validation in ((a, "NONE"), (b, "WELL_FORMED_XML")):
        broker.op("create_message_type", "Doc", validation=validation)
        broker.op("create_contract", "Docs", {"Doc": "INITIATOR"})
    b.op("create_service", "DocService", "Target", ["Docs"])
    a.op("create_route", "docs", "DocService", f"tcp://{b.address}", broker_instance=B_ID)
    handle = a.op("begin_dialog", "InitiatorService", "DocService", "Docs", broker_instance=B_ID)
    a.op("send", handle, "Doc", [b"<first/>"])
    await world.settle()  # the dialog is established on B
    a.op("send", handle, "Doc", [b"<a/>", b"<b/>", b"not xml", b"<c/>"])  # one bundle
    await world.settle()
    # the error drops the conversation's messages; the one after the refused one never comes
    ((mtype, body),) = [(row[MTYPE], row[BODY]) for row in b.core.receive_all()]
    assert mtype.endswith("/Error") and b"WELL_FORMED_XML" in body
    ((mtype, body),) = [(row[MTYPE], row[BODY]) for row in a.core.receive_all("Initiator")]
    assert mtype.endswith("/Error") and b"WELL_FORMED_XML" in body
    assert a.transmission_queue() == 0

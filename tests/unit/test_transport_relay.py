"""Bundles through a forwarder, without a daemon: A -> F -> B on an in-memory network with
one fake clock (see transport_harness). A bundle leaves F as it came, sealed by A for B:
F cannot alter it unnoticed; a next hop of an older protocol version gets no bundles,
and a broker of version 3 (which refused any newer offer) is still talked to."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from ssb.broker._transport.forwarding import Frame, Hop
from ssb.protocol import (
    PROTOCOL_VERSION,
    BundleFrame,
    ErrorCode,
    LinkConnection,
    RemoteProtocolError,
    Role,
)

from .core_harness import BODY
from .transport_harness import B_ID, Broker, World

COUNT = 600  # small messages sent in one transaction: several bundles' worth


def _trio(world: World) -> tuple[Broker, Broker, Broker]:
    """A (InitiatorService) -> F (forwarding) -> B (TargetService), routes naming B."""
    return world.trio(name_brokers=True)


async def _dialog(world: World, a: Broker, b: Broker) -> str:
    """A dialog A -> B whose first message has arrived (the direction is confirmed)."""
    handle: str = a.op("begin_dialog", "InitiatorService", "TargetService")
    a.op("send", handle, "DEFAULT", [b"first"])
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all()] == [b"first"]
    return handle


def _bodies() -> list[bytes]:
    return [b"m%04d" % n for n in range(COUNT)]


def _relayed(f: Broker) -> list[Frame]:
    """Records every frame F's forwarder writes (and writes it)."""
    forwarder = f.transport.forwarder
    assert forwarder is not None
    written: list[Frame] = []
    send = forwarder.send

    def recording(hop: Hop, frames: list[Frame]) -> bool:
        taken = send(hop, frames)
        if taken:
            written.extend(frames)
        return taken

    forwarder.send = recording
    return written


async def test_bundles_are_relayed_as_bundles(tmp_path: Path) -> None:
    world = World(tmp_path, forwarding=True)
    a, f, b = _trio(world)
    handle = await _dialog(world, a, b)
    written = _relayed(f)
    a.op("send", handle, "DEFAULT", _bodies())
    await world.settle()
    assert [row[BODY] for row in b.core.receive_all()] == _bodies()
    assert a.transmission_queue() == 0
    bundles = [frame for frame in written if isinstance(frame, BundleFrame)]
    assert sum(len(bundle.payloads) for bundle in bundles) == COUNT
    assert len(bundles) <= COUNT // 100  # many messages to a bundle, not one each
    link, forwarder = a.link_to(f), f.transport.forwarder
    assert link is not None and link.connection.peer_version == PROTOCOL_VERSION
    (relay,) = f.transport.views()["forwarded_conversations"]()
    assert relay["status"] == "" and forwarder is not None and forwarder.unbundled == 0


async def test_a_forwarder_cannot_alter_a_bundle_it_relays(tmp_path: Path) -> None:
    world = World(tmp_path, forwarding=True)
    a, f, b = _trio(world)
    handle = await _dialog(world, a, b)
    forwarder = f.transport.forwarder
    assert forwarder is not None
    send = forwarder.send
    altered: list[BundleFrame] = []

    def altering(hop: Hop, frames: list[Frame]) -> bool:
        """Swaps two messages of the first bundle, as a dishonest forwarder would."""
        out = []
        for frame in frames:
            if isinstance(frame, BundleFrame) and not altered and len(frame.payloads) > 1:
                payloads = (frame.payloads[1], frame.payloads[0], *frame.payloads[2:])
                frame = dataclasses.replace(frame, payloads=payloads)
                altered.append(frame)
            out.append(frame)
        return send(hop, out)

    forwarder.send = altering
    a.op("send", handle, "DEFAULT", _bodies())
    await world.settle()
    assert altered
    assert b.peer(f).corrupt_fragments >= 1  # caught at B, counted against who brought it
    assert b.queue("Target") < COUNT  # what the altered bundle carried is not taken
    await world.advance(60)  # A retransmits what B did not acknowledge
    assert [row[BODY] for row in b.core.receive_all()] == _bodies()
    assert a.transmission_queue() == 0


async def test_a_next_hop_of_an_older_version_gets_no_bundles_and_the_origin_learns_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(tmp_path, forwarding=True)
    a, f, b = _trio(world)
    f.transport.links.offers[b.address] = 3  # F and B speak version 3, as with an older B
    handle = await _dialog(world, a, b)
    assert f.link_to(b).connection.peer_version == 3  # type: ignore[union-attr]
    written = _relayed(f)
    a.op("send", handle, "DEFAULT", _bodies()[:300])
    await world.settle()
    forwarder = f.transport.forwarder
    assert forwarder is not None and forwarder.unbundled >= 1
    assert not a.peer(b).relayed_bundles  # F told A: B's messages go as fragments now
    dropped = forwarder.unbundled
    a.op("send", handle, "DEFAULT", _bodies()[300:])
    await world.settle()
    assert forwarder.unbundled == dropped  # none more came
    await world.advance(60)  # what was dropped comes again, as fragments
    assert [row[BODY] for row in b.core.receive_all()] == _bodies()
    assert a.transmission_queue() == 0
    assert not any(isinstance(frame, BundleFrame) for frame in written)
    said = [r.getMessage() for r in caplog.records if "takes no relayed bundles" in r.getMessage()]
    assert len(said) == 1  # logged once
    # a new connection to the forwarder may find the way upgraded: bundles are tried again
    world.network.cut(a.transport.links)
    await world.settle()
    assert a.peer(b).relayed_bundles


class OldAcceptor(LinkConnection):
    """A version 2 or 3 broker's side of the handshake: it refused a newer offer, naming
    its version (2: only its own) or its range (3)."""

    speaks = 3

    def _check_peer(self, version: int, broker_id: uuid.UUID, certificate_pem: bytes) -> None:
        if self.role is Role.ACCEPTOR and version > self.speaks:
            range_ = "2" if self.speaks == 2 else f"2..{self.speaks}"
            raise RemoteProtocolError(
                f"peer speaks protocol version {version}, we speak {range_}",
                ErrorCode.HANDSHAKE_FAILED,
            )
        super()._check_peer(version, broker_id, certificate_pem)


class VersionTwoAcceptor(OldAcceptor):
    speaks = 2


@pytest.mark.parametrize("old", [OldAcceptor, VersionTwoAcceptor])
async def test_a_broker_of_an_older_version_is_talked_to_at_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: type[OldAcceptor]
) -> None:
    world = World(tmp_path)
    a, b = world.pair()
    trust = b.transport.trust
    made = trust.new_connection

    def older(role: Role, version: int) -> LinkConnection:
        connection = made(role, version)
        connection.__class__ = old
        return connection

    monkeypatch.setattr(trust, "new_connection", older)
    handle = a.op("begin_dialog", "InitiatorService", "TargetService")
    a.op("send", handle, "DEFAULT", _bodies())
    await world.advance(0.001)  # the next connection at once, not after a backoff
    assert [row[BODY] for row in b.core.receive_all()] == _bodies()
    link = a.link_to(b)
    assert link is not None and link.connection.peer_version == old.speaks
    assert a.transport.links.offers[b.address] == old.speaks
    assert a.transport.links.connect_errors == {}  # no backoff, nothing to report
    views: Any = a.transport.views()["broker_connections"]()
    assert all(row["state"] == "ESTABLISHED" for row in views if row["peer"] == B_ID)

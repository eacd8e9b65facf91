"""Peers: the brokers this broker holds dialogs with, and the link each one's frames take.

Theory of operation. A `Peer` is made on first need, when a certificate of that broker is
trusted here or its handshake presents one. An adjacent peer's frames go on its own
link. A peer reached through a forwarding broker has no link of its own: its frames
travel on the forwarder's (`link_of`: the broker its frames arrive through, `Peer.via`,
or the broker its route's address turned out to be, `address_peer`). Incoming frames go
to the peer whose dialog they belong to: `far` maps the conversations held with a
non-adjacent peer (learned from the first frame of one), and `partner` finds the rest.

If both brokers connect at once, both keep the connection opened by the broker with the
smaller instance id (`attach`). `relay_hop` and `relay_send` are the forwarder's next-hop
lookup and writer (see `forwarding`).
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass, field

from ssb.protocol import (
    RELAY_BUNDLES_VERSION,
    AckFrame,
    DialogPeer,
    Direction,
    FragmentFrame,
    RetryPolicy,
    Role,
    UnbundleFrame,
)

from .._core.ports import RouteLookup
from .forwarding import Frame, Hop
from .link import Link, Links, Peer
from .refusals import RefusalLog
from .settings import TransportSettings
from .trust import Trust

log = logging.getLogger("ssb.transport")


@functools.lru_cache(maxsize=4096)
def route_address(address: str, service: str) -> str | None:
    """The "host:port" a route's address names (a TRANSPORT route: the service's name),
    or None when it names none."""
    if address == "TRANSPORT":
        address = service
    if not address.startswith("tcp://"):
        return None
    return address[len("tcp://") :].split("/", 1)[0]


@dataclass(eq=False)
class Peers:
    """Every broker this broker holds dialogs with."""

    instance: uuid.UUID
    trust: Trust
    routes: RouteLookup
    links: Links
    refusals: RefusalLog
    settings: TransportSettings
    all: dict[uuid.UUID, Peer] = field(init=False, default_factory=dict)
    # conversations whose dialogs are with a broker other than the adjacent one their
    # frames arrive from (found on the first such frame; see partner)
    far: dict[uuid.UUID, Peer] = field(init=False, default_factory=dict)
    # the broker each dialled address is
    address_peer: dict[str, uuid.UUID] = field(init=False, default_factory=dict)

    def get(self, instance: uuid.UUID, certificate_pem: bytes | None = None) -> Peer | None:
        """The peer `instance`, made if a certificate of it is given or trusted."""
        peer = self.all.get(instance)
        if peer is not None:
            return peer
        pem = certificate_pem or self.trust.trusted_certificate(instance)
        if pem is None:
            return None
        s = self.settings
        dialog = DialogPeer(
            private_key=self.trust.identity.private_keys,
            peer_public_key=pem,
            fragment_size=s.fragment_size,
            retry=RetryPolicy(initial=s.retry_initial, factor=2.0, maximum=s.retry_max),
            ack_delay=s.ack_delay,
            starvation_bound=s.starvation_bound,
        )
        peer = self.all[instance] = Peer(instance, dialog, pem)
        return peer

    def rekey(self) -> None:
        """This broker's identity changed: receivers opened from now on use its keys."""
        for peer in self.all.values():
            peer.dialog.private_key = self.trust.identity.private_keys

    def attach(self, link: Link, instance: uuid.UUID, certificate_pem: bytes) -> Peer | None:
        """Make `link`, whose handshake proved broker `instance`, that peer's connection.
        None: it duplicates the link already up, and is closed."""
        peer = self.get(instance, certificate_pem)
        assert peer is not None
        if link.role is Role.INITIATOR:
            # known before a duplicate is closed: peers routed to this address use the
            # connection that stays, whichever it is
            self.address_peer[link.address] = instance
        if peer.certificate_pem != certificate_pem:
            log.info("broker %s presents a new certificate; new dialogs use it", instance)
            peer.certificate_pem = certificate_pem
        current = peer.link
        if current is not None and current is not link and not current.closed:
            keep_ours = self.instance < instance
            current_is_ours = current.role is Role.INITIATOR
            if current_is_ours == keep_ours:
                link.peer = None
                link.shut("duplicate connection", "a duplicate of the link already up")
                return None
            current.peer = None
            current.close("replaced by a newer connection")
        link.peer = peer
        peer.link = link
        log.info(
            "link to broker %s up (%s, %s)",
            instance,
            link.address,
            "outbound" if link.role is Role.INITIATOR else "inbound",
        )
        if link.role is Role.INITIATOR:
            peer.address = peer.address or link.address
        return peer

    # ---- which link a peer's frames take --------------------------------------------

    def link_of(self, peer: Peer) -> Link | None:
        """The connection a peer's frames go on: its own, or the one to the forwarder its
        frames arrive through or its route's address leads to."""
        link = peer.link
        if link is not None and not link.closed:
            return link
        hops = (peer.via, None if peer.address is None else self.address_peer.get(peer.address))
        for hop in hops:
            if hop is not None and hop != peer.instance:
                forwarder = self.all.get(hop)
                if forwarder is not None and forwarder.link is not None:
                    return forwarder.link
        return None

    def routed_via(self, adjacent: Peer) -> list[Peer]:
        """Peers whose frames travel on `adjacent`'s connection (it forwards them)."""
        return [
            p
            for p in self.all.values()
            if p is not adjacent
            and p.link is None
            and (
                p.via == adjacent.instance
                or (p.address is not None and self.address_peer.get(p.address) == adjacent.instance)
            )
        ]

    def address_of(self, peer: Peer) -> str | None:
        """Where routes say this peer is now (they may have changed or expired), else
        where it was, else where the forwarder its frames arrive through is."""
        for service in peer.services:
            route = self.routes.find(service, str(peer.instance))
            if route is not None and route.address != "LOCAL":
                address = route_address(route.address, service)
                if address is not None:
                    return address
        if peer.address is None and peer.via is not None:
            forwarder = self.all.get(peer.via)
            return None if forwarder is None else forwarder.address
        return peer.address

    def partner(self, adjacent: Peer, frame: Frame) -> Peer | None:
        """The broker a frame's dialog is with, when `far` does not say: the adjacent
        one, or (the first frame of a restored dialog through a forwarder) the peer that
        has the dialog. None: the frame is not for this broker and is dropped."""
        conv, direction = frame.conversation_id, frame.direction
        dialog = adjacent.dialog
        if isinstance(frame, AckFrame):
            if dialog.sender(conv, direction) is not None:
                return adjacent
        elif dialog.receiver(conv, direction) is not None:
            return adjacent
        envelope = frame.envelope if isinstance(frame, FragmentFrame) else None
        if envelope is not None and envelope.from_broker_id == self.instance:
            self.refusals(
                (conv, direction),
                "routes form a loop: a message of conversation %s that this broker sent came"
                " back from broker %s; check the routes on the way",
                conv,
                adjacent.instance,
            )
            return None
        if envelope is not None and envelope.to_broker_id != self.instance:
            self.refusals(
                (conv, direction),
                "dropping conversation %s from broker %s: it is addressed to broker %s and"
                " this broker does not forward ([transport] forwarding = false)",
                conv,
                adjacent.instance,
                envelope.to_broker_id,
            )
            return None
        for peer in self.all.values():
            if peer is adjacent:
                continue
            d = peer.dialog
            if any(
                d.sender(conv, way) is not None or d.receiver(conv, way) is not None
                for way in Direction
            ):
                if envelope is not None and envelope.from_broker_id != peer.instance:
                    self.refusals(
                        (conv, direction),
                        "refusing conversation %s from broker %s: the conversation is with"
                        " broker %s",
                        conv,
                        envelope.from_broker_id,
                        peer.instance,
                    )
                    return None
                return peer
        return adjacent

    # ---- the forwarder's hops ---------------------------------------------------------

    def relay_hop(self, service: str, broker: uuid.UUID) -> Hop | None:
        """The forwarder's next hop for a far service: the adjacent broker (or, not yet
        connected, the address) this broker's routes give."""
        route = self.routes.find(service, str(broker))
        if route is None or route.address == "LOCAL":
            return None
        address = route_address(route.address, service)
        if address is None:
            return None
        known = self.address_peer.get(address)
        if known is not None:
            return known
        peer = self.all.get(broker)
        if peer is not None and peer.link is not None and not peer.link.closed:
            return broker  # connected already (it connected to us): no need to dial
        return address

    def relay_takes_bundles(self, hop: Hop) -> bool:
        """Whether the forwarder's next hop takes relayed bundles (True until connected)."""
        peer = None if isinstance(hop, str) else self.all.get(hop)
        link = None if peer is None else peer.link
        if link is None or not link.established:
            return True
        return link.connection.peer_version >= RELAY_BUNDLES_VERSION

    def relay_notify(self, hop: uuid.UUID, notice: UnbundleFrame) -> None:
        """Write the forwarder's notice to an adjacent broker, if its link is up."""
        peer = self.all.get(hop)
        link = None if peer is None else peer.link
        if (
            link is not None
            and link.established
            and link.connection.peer_version >= RELAY_BUNDLES_VERSION
        ):
            link.write(link.connection.send(notice))

    def unbundled(self, adjacent: Peer, notice: UnbundleFrame) -> None:
        """The forwarder `adjacent` says bundles of a dialog of ours cannot go on beyond
        it: the far broker's messages go as fragments from now on (until the link to
        the forwarder is lost). Taken only from the forwarder its frames go through."""
        conv, direction = notice.conversation_id, notice.direction
        peer = self.far.get(conv)
        if peer is None:
            peer = next(
                (p for p in self.all.values() if p.dialog.sender(conv, direction) is not None),
                None,
            )
        if peer is None or peer is adjacent or self.link_of(peer) is not adjacent.link:
            return
        if peer.relayed_bundles:
            peer.relayed_bundles = False
            log.info(
                "broker %s passes no bundles on to broker %s (a broker on the way speaks a"
                " protocol version older than 4): its messages go as fragments",
                adjacent.instance,
                peer.instance,
            )

    def relay_send(self, hop: Hop, frames: list[Frame]) -> bool:
        """Write relayed frames to `hop`, or say it cannot take them now (and connect)."""
        if isinstance(hop, str):
            address: str | None = hop
            peer = None
        else:
            peer = self.all.get(hop)
            address = None if peer is None else self.address_of(peer)
        link = None if peer is None else peer.link
        if link is None or not link.established:
            if address is not None:
                self.links.connect(address)
            return False
        if link.paused:
            return False
        send = link.connection.send
        link.write(b"".join([send(frame) for frame in frames]))
        return True

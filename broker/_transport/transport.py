"""The broker-to-broker transport: a facade over parts split by the state each owns.

Theory of operation. Each broker this one holds dialogs with is a `Peer` whose sans-IO
`DialogPeer` (protocol's dialog layer: sequencing, fragmentation, acks, integrity)
outlives TCP connections. The parts, each owning its state:

    trust       this broker's identity, the certificates and bindings it trusts, TLS
    link        connections: dialled with backoff, accepted at a rate, closed when idle
    peers       the brokers, and the link each one's frames take (own, or a forwarder's)
    pump        due frames onto links; one timer per peer
    outbound    transmission-queue work placed on peers and fed within a budget; acks
    receivers   incoming directions opened (who may), restored, closed
    inbound     frames to events, one handler per event; acks only once durable
    locator     which broker hosts a service a route without a broker instance leads to
    forwarding  other brokers' dialogs relayed along this broker's routes (optional)
    views       broker_connections, forwarded_conversations

The transport is the core's `OutboundSink`, the links' `LinkEvents` and trust's
`TrustListener`, and passes each call to the part that owns what it changes. It reaches
the core only through the ports it is given (`_core.ports`: remote delivery, endpoint
and route lookups, the peer catalog, catalog statements; `ports`: the store's
remote-dialog tables, a monotonic clock, a connector), so tests build it on an
in-memory store, a fake clock and an in-memory network.

Start: receivers and senders come back from the store, the broker port listens, every
direction with waiting entries is placed, every peer pumped. Stop: every link is closed
with a reason, and whatever is pending cancelled.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ssb.protocol import (
    HandshakeCompleted,
    LocatedFrame,
    LocateFrame,
    Role,
    UnbundleFrame,
)

from .._core.conversations import Endpoint
from .._core.ports import (
    CatalogStatements,
    EndpointLookup,
    OutboundRelay,
    PeerCatalog,
    RouteLookup,
)
from .._core.remote import RemoteDelivery
from .._core.transmission import DialogOutbox, Outbound
from .forwarding import Forwarder
from .inbound import Reception
from .link import Frames, Link, Links, Peer
from .locator import Locator
from .outbound import Transmission
from .peers import Peers, route_address
from .ports import Clock, Connector, RemoteDialog, RemoteDialogStore, SendPermission
from .pump import Pump
from .receivers import HeldPartial, Receivers
from .refusals import RefusalLog
from .settings import TransportSettings
from .trust import Trust
from .views import TransportViews

log = logging.getLogger("ssb.transport")


class Transport:
    """All adjacent brokers of this broker; the core's OutboundSink."""

    def __init__(
        self,
        *,
        instance: str,
        delivery: RemoteDelivery,
        endpoints: EndpointLookup,
        routes: RouteLookup,
        catalog: PeerCatalog,
        statements: CatalogStatements,
        store: RemoteDialogStore,
        clock: Clock,
        connector: Connector,
        wall_clock: Callable[[], float],
        data_dir: Path,
        settings: TransportSettings,
        relay: OutboundRelay,
        permission: SendPermission,
        identity_changed: Callable[[], None] = lambda: None,
    ) -> None:
        """Args:
        instance: this broker's instance id.
        delivery, endpoints, routes, catalog, statements: the core's parts, as ports.
        relay: the core's sink; the transport connects to it (the core tells it of
            transmission-queue work, ended conversations, changed routes).
        permission: whether another broker's messages may go to a service here.
        store: the store's remote-dialog tables and batches.
        clock: monotonic time and timers (the event loop).
        connector: opens connections to other brokers (the event loop).
        wall_clock: seconds since the epoch, for views.
        data_dir: where this broker's identity files are.
        identity_changed: told when they change (to keep them in the store).
        """
        self.instance_id = instance
        self.settings = settings
        self.store = store
        self.clock = clock
        me = uuid.UUID(instance)
        self.trust = Trust(
            me,
            data_dir,
            catalog,
            statements,
            endpoints,
            settings,
            self,
            permission.is_principal,
            identity_changed,
        )
        self.links = Links(self, self.trust, clock, connector, settings, self._mirror)
        self.routes = routes
        refusals = RefusalLog(clock)
        self.registry = registry = Peers(me, self.trust, routes, self.links, refusals, settings)
        self.forwarder = (
            Forwarder(
                me,
                settings.forward_size * 1024 * 1024,
                min(1.0, settings.retry_initial / 2),
                registry.relay_hop,
                registry.relay_send,
                registry.relay_takes_bundles,
                registry.relay_notify,
            )
            if settings.forwarding
            else None
        )
        self.pump = Pump(registry, self.links, clock, self.forwarder, settings.fragment_size)
        self.locator = Locator(
            me,
            self.trust,
            routes,
            lambda service: routes.is_local(service, None),
            registry,
            self.links,
            clock,
            settings,
            self._located,
            self._wants_location,
        )
        self.receivers = Receivers(
            me, endpoints, catalog, store, clock, self.trust, registry, refusals, settings
        )
        self.transmission = Transmission(
            me,
            delivery,
            endpoints,
            routes,
            store,
            clock,
            self.trust,
            registry,
            self.links,
            self.pump,
            refusals,
            settings,
            self.receivers.envelopes.get,
            self.locator,
        )
        self.reception = Reception(
            delivery,
            endpoints,
            store,
            clock,
            registry,
            self.receivers,
            self.transmission,
            self.pump,
            self.forwarder,
            refusals,
            self.trust.login_of,
            permission.may_send,
        )
        self._may_send = permission.may_send
        self.views_ = TransportViews(self.links, registry, self.forwarder, clock, wall_clock)
        # the busiest calls go straight to the part that answers them
        self.outbound: Callable[[DialogOutbox], None] = self.transmission.outbound
        self.frames: Callable[[Link, Frames], None] = self.reception.frames
        relay.connect(self)

    def _mirror(self, address: str) -> str | None:
        """The mirror address (host:port) of a route whose address is `address`."""
        for principal, mirror in self.routes.mirrors().items():
            if route_address(principal, "") == address:
                return route_address(mirror, "")
        return None

    @property
    def peers(self) -> dict[uuid.UUID, Peer]:
        """Every broker this broker holds dialogs with, by instance id."""
        return self.registry.all

    # ---- start and stop ------------------------------------------------------------

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Restore, listen for other brokers on `host`:`port` (0: any free port), and
        send what waits; returns the address bound."""
        self.restore()
        bound = await self.links.listen(host, port)
        self.resume()
        return bound

    def restore(self) -> None:
        """Receivers and senders from their persisted state."""
        remote_dialogs, held_fragments = self.store.load_remote()
        held = self.reception.restore_held(held_fragments)
        for remote in map(RemoteDialog.from_row, remote_dialogs):
            peer = self.registry.get(remote.peer_id)
            if peer is None:
                log.warning(
                    "no trusted certificate for broker %s; dialog %s waits",
                    remote.peer_id,
                    remote.conversation_id,
                )
                continue
            if remote.side == "recv":
                restored = held.get((remote.conversation_id, remote.direction), ())
                self.reception.apply(peer, self.receivers.restore(peer, remote, restored))
            else:
                self.transmission.restore(peer, remote)

    def resume(self) -> None:
        """Check for idle links from now on, place every direction that waits, pump."""
        self.links.start()
        self.transmission.place_all()
        for peer in self.registry.all.values():
            self.pump.pump(peer)

    async def close(self) -> None:
        self.pump.stop()
        await self.links.close()

    # ---- the core's OutboundSink (`outbound` is bound in __init__) ---------------------

    def endpoint_removed(self, ep: Endpoint) -> None:
        """A local endpoint closed: forget its dialog directions to other brokers."""
        if ep.far_broker_instance in (None, self.instance_id):
            return
        try:
            instance = uuid.UUID(ep.far_broker_instance)
        except ValueError:
            return
        peer = self.registry.all.get(instance)
        if peer is not None:
            self.transmission.endpoint_removed(peer, ep)
        self.receivers.endpoint_removed(peer, ep)

    def routes_changed(self) -> None:
        """A route was created or dropped: messages may now have somewhere to go."""
        self.locator.forget()
        self.transmission.replace_all()
        for peer in self.registry.all.values():
            if peer.link is None and peer.has_work():
                self.pump.pump(peer)

    def may_deliver(self, from_broker: str, service: str) -> bool:
        try:
            broker = uuid.UUID(from_broker)
        except ValueError:
            return False
        return self._may_send(self.trust.login_of(broker), service)

    def describe(self, out: Outbound) -> str:
        return self.transmission.describe(out)

    # ---- LinkEvents (`frames` is bound in __init__) ---------------------------------

    def established(self, link: Link, event: HandshakeCompleted) -> None:
        instance, pem = event.peer_broker_id, event.peer_certificate_pem
        if self.settings.tls and not Trust.tls_matches(link.transport, pem):
            log.warning(
                "closing broker connection %s: its TLS certificate is not the one broker %s"
                " proved in the handshake",
                link.address,
                instance,
            )
            link.close()
            return
        peer = self.registry.attach(link, instance, pem)
        if self.forwarder is not None:
            if link.role is Role.INITIATOR:
                self.forwarder.rename(link.address, instance)
            if peer is None:
                self.forwarder.flush(instance)  # what waited for the address goes
        if peer is None:
            return
        if link.role is Role.INITIATOR:
            self.links.reached(link.address)
            self.locator.link_up(link.address, link)
            self.transmission.address_known(link.address)
        now = self.clock.time()
        for routed in [peer, *self.registry.routed_via(peer)]:
            routed.dialog.retransmit_all(now)
        self.pump.writable(peer)

    def lost(self, link: Link) -> None:
        peer = link.peer
        if self.links.closing:
            return
        if peer is not None and peer.link is link:
            peer.link = None
            log.info("link to broker %s down (%s): %s", peer.instance, link.address, link.reason)
            for routed in [peer, *self.registry.routed_via(peer)]:
                routed.relayed_bundles = True  # the next forwarder may pass them on
                if routed.has_work():
                    self.pump.pump(routed)
        elif peer is None and link.role is Role.INITIATOR:
            address = link.address
            if self.transmission.waits_for(address) or any(
                p.address == address and p.link is None and p.has_work()
                for p in self.registry.all.values()
            ):
                self.links.retry_later(address)

    def writable(self, peer: Peer) -> None:
        self.pump.writable(peer)

    def unbundle(self, link: Link, frame: UnbundleFrame) -> None:
        adjacent = link.peer
        if adjacent is None:
            return
        if self.forwarder is None or not self.forwarder.unbundle(frame, self.clock.time()):
            self.registry.unbundled(adjacent, frame)

    def locate(self, link: Link, frame: LocateFrame | LocatedFrame) -> None:
        self.locator.received(link, frame)

    def _located(self, service: str, address: str) -> None:
        self.transmission.located(service, address)

    def _wants_location(self, service: str, address: str) -> bool:
        return self.transmission.wants_location(service, address)

    def retry(self, address: str) -> None:
        """Try again: routes may have changed (expired, dropped, added) meanwhile."""
        if self.links.closing:
            return
        self.transmission.address_known(address)
        for peer in self.registry.all.values():
            if peer.link is None and peer.address == address and peer.has_work():
                self.pump.pump(peer)

    def housekeeping(self, now: float) -> None:
        if self.forwarder is not None:
            settings = self.settings
            self.forwarder.expire(
                now, max(settings.closed_dialog_linger, 2 * settings.retry_max), settings.retry_max
            )

    # ---- TrustListener ---------------------------------------------------------------

    def tls_changed(self) -> None:
        self.links.tls_changed()

    def trust_added(self) -> None:
        self.locator.forget()
        self.transmission.replace_all()

    def rotated(self) -> None:
        self.registry.rekey()
        self.links.close_all("broker certificate rotated")  # peers meet the new certificate

    # ---- operations and views for clients -------------------------------------------

    def operations(self) -> dict[str, Callable[..., Any]]:
        return self.trust.operations()

    def views(self) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        return {
            "broker_connections": self.views_.connections,
            "certificates": self.trust.certificates_view,
            "forwarded_conversations": self.views_.forwarded,
            "remote_service_bindings": self.trust.bindings_view,
        }

    def connections_view(self) -> list[dict[str, Any]]:
        return self.views_.connections()

    def partials(self) -> list[HeldPartial]:
        """Messages from other brokers that are still arriving, with where they go."""
        return self.receivers.partials()

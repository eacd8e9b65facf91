"""Locating: which broker hosts a service that a route without a broker instance leads to.

Theory of operation. In Service Broker a route need not name the broker instance of its
service: its address may be the broker that hosts the service, or a forwarder on the
way. Every dialog direction here is sealed end to end, its session key wrapped for the
far broker's certificate, so the origin must know the far broker before its first
message leaves. When a route names none, the origin asks along the route which broker
hosts the service (`LocateFrame`, with a random token), and the broker that hosts it
answers with its signature over the question (`LocatedFrame`); the origin accepts the
answer only when a certificate of that broker is trusted here and the signature verifies
with it. The answer is kept per (service, route address) until routes or trust change.

A broker that hosts the service answers itself, and so does one that does not forward:
every route that reaches it ends there (it holds what comes for a service it lacks, as
before brokers could be asked). A forwarder passes the question on along its own route
for the service (at most MAX_LOCATE_HOPS brokers; a question that would go back the way
it came is a loop), remembering where each relayed question came from for a while so
that its answer goes back the same way; a question for a hop not yet connected waits for
that connection. A forwarder without a route on answers why not, in words that say what
to do, and logs that once per service. The origin shows the words as the transmission status of
the messages that wait, asks again with the usual backoff (retry_initial, doubling up to
retry_max) while no answer came or the answer was no, and places those messages on the
found broker as soon as it is known.

A peer of protocol version 2 cannot be asked: the broker at the address is taken as the
one that hosts the service, as before.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ssb.protocol import (
    LOCATE_TOKEN_SIZE,
    LOCATE_VERSION,
    MAX_LOCATE_HOPS,
    IntegrityError,
    LocatedFrame,
    LocateFrame,
    sign_location,
    verify_location,
)

from .._core.ports import Cancellable, RouteLookup
from .link import Link, Links, Peer
from .peers import Peers, route_address
from .ports import Clock
from .refusals import SaidOnce
from .settings import TransportSettings
from .trust import Trust

log = logging.getLogger("ssb.transport")

MAX_RELAYED: Final = 10_000  # questions relayed and not yet answered, at most
MAX_REASON: Final = 300  # characters of a peer's reason kept in a transmission_status

Place = tuple[str, str]  # (service, route address)


@dataclass(slots=True, eq=False)
class Lookup:
    """This broker's question about one service along one route address."""

    token: bytes
    status: str
    found: uuid.UUID | None = None
    delay: float = 0.0
    timer: Cancellable | None = None


@dataclass(eq=False)
class Locator:
    """The lookups this broker asks, answers and relays.

    `is_local(service)`: whether this broker hosts the service; `answered(service,
    address)`: a lookup ended (found or not): the messages waiting for it are placed
    again; `wanted(service, address)`: whether messages still wait for that lookup (one
    nobody waits for any more is not asked again)."""

    instance: uuid.UUID
    trust: Trust
    routes: RouteLookup
    is_local: Callable[[str], bool]
    peers: Peers
    links: Links
    clock: Clock
    settings: TransportSettings
    answered: Callable[[str, str], None]
    wanted: Callable[[str, str], bool]
    lookups: dict[Place, Lookup] = field(init=False, default_factory=dict)
    tokens: dict[bytes, Place] = field(init=False, default_factory=dict)
    # relayed questions: token -> (the adjacent broker it came from, when)
    relayed: dict[bytes, tuple[uuid.UUID, float]] = field(init=False, default_factory=dict)
    # questions to relay once the connection to their next hop's address is up
    held: dict[str, list[tuple[LocateFrame, uuid.UUID]]] = field(init=False, default_factory=dict)
    # the origin asks again and again: one line is enough
    _say: SaidOnce = field(init=False, default_factory=SaidOnce)

    # ---- the origin's side ----------------------------------------------------------

    def far_broker(self, service: str, address: str, adjacent: Peer) -> uuid.UUID | None:
        """The broker that hosts `service` along the route to `address`, whose broker is
        `adjacent`, connected; None while it is not known (`status` says why)."""
        link = adjacent.link
        if link is None or link.connection.peer_version < LOCATE_VERSION:
            return adjacent.instance  # a broker of version 2 is taken at its word
        place = (service, address)
        lookup = self.lookups.get(place)
        if lookup is None:
            token = os.urandom(LOCATE_TOKEN_SIZE)
            lookup = self.lookups[place] = Lookup(
                token,
                f"asking the broker at {address} which broker hosts service '{service}'",
            )
            self.tokens[token] = place
            self._ask(place, lookup)
        return lookup.found

    def status(self, service: str, address: str) -> str:
        lookup = self.lookups.get((service, address))
        return "" if lookup is None else lookup.status

    def forget(self) -> None:
        """Routes or trust changed: every answer is asked again when next needed."""
        for lookup in self.lookups.values():
            if lookup.timer is not None:
                lookup.timer.cancel()
        self.lookups.clear()
        self.tokens.clear()

    def _ask(self, place: Place, lookup: Lookup) -> None:
        """Send the question on the link to the route's address (connecting if it is
        down), and ask again after the backoff unless an answer says where."""
        service, address = place
        hop = self.peers.address_peer.get(address)
        peer = None if hop is None else self.peers.all.get(hop)
        link = None if peer is None else peer.link
        if link is not None and link.established:
            link.write(link.connection.send(LocateFrame(lookup.token, service, self.instance)))
        else:
            self.links.connect(address)
        settings = self.settings
        lookup.delay = min(max(lookup.delay * 2, settings.retry_initial), settings.retry_max)
        lookup.timer = self.clock.call_later(lookup.delay, self._again, place, lookup)

    def _again(self, place: Place, lookup: Lookup) -> None:
        lookup.timer = None
        if self.lookups.get(place) is not lookup or lookup.found is not None:
            return
        if not self.wanted(*place):  # the dialogs that needed it have ended
            del self.lookups[place]
            self.tokens.pop(lookup.token, None)
            self._say.resolved(f"lookup:{place[0]}:{place[1]}")
        elif not self.links.closing:
            self._ask(place, lookup)

    def _result(self, frame: LocatedFrame) -> None:
        place = self.tokens.get(frame.token)
        lookup = None if place is None else self.lookups.get(place)
        if place is None or lookup is None or frame.service != place[0]:
            return  # not this broker's question, or one forgotten since
        service, address = place
        broker = frame.broker_id
        topic = f"lookup:{service}:{address}"  # one line a place (a reason is the peer's text)
        if broker is None:
            reason = "".join(c for c in frame.reason[:MAX_REASON] if c.isprintable())
            lookup.status = reason or f"no broker along {address} hosts service '{service}'"
        elif broker == self.instance:
            lookup.status = (
                f"the route to {address} for service '{service}' leads back to this broker"
            )
        else:
            pems = self.trust.trusted_certificates(broker)
            if not pems:
                lookup.status = (
                    f"service '{service}' is at broker {broker} (found through {address}),"
                    " whose certificate is not trusted here: create_certificate with its"
                    " broker_certificate()"
                )
            else:
                if not any(self._proved(pem, frame, broker) for pem in pems):
                    lookup.status = (
                        f"broker {broker}'s answer that it hosts service '{service}' does not"
                        " verify with its certificate; asking again"
                    )
                else:
                    lookup.found, lookup.status = broker, ""
                    self._say.resolved(topic)
                    if lookup.timer is not None:
                        lookup.timer.cancel()
                        lookup.timer = None
                    log.info("service '%s' (route to %s) is at broker %s", service, address, broker)
        if lookup.status:
            self._say(
                topic,
                "messages for service '%s' wait: %s",
                service,
                lookup.status,
            )
        self.answered(service, address)

    def _proved(self, pem: bytes, frame: LocatedFrame, broker: uuid.UUID) -> bool:
        assert frame.proof is not None  # a found broker comes with its proof
        try:
            verify_location(pem, frame.token, frame.service, broker, self.instance, frame.proof)
        except IntegrityError:
            return False
        return True

    # ---- questions from other brokers ------------------------------------------------

    def received(self, link: Link, frame: LocateFrame | LocatedFrame) -> None:
        """A question or an answer from the adjacent broker of `link`."""
        came_from = link.peer
        if came_from is None:
            return
        if isinstance(frame, LocatedFrame):
            relayed = self.relayed.pop(frame.token, None)
            if relayed is None:
                self._result(frame)
            else:
                self._send(self.peers.all.get(relayed[0]), frame)
            return
        reason = self._answer(frame, came_from)
        if reason is not None:
            self._send(came_from, LocatedFrame(frame.token, frame.service, None, None, reason))

    def _answer(self, frame: LocateFrame, came_from: Peer) -> str | None:
        """Answer `frame` if this broker hosts its service, else relay it; returns why
        neither can be done (None: answered or relayed, or the origin asks again)."""
        service, me = frame.service, self.instance
        if self.is_local(service) or not self.settings.forwarding:
            # the service is here, or this broker (it does not forward) is where every route
            # that reaches it ends, as it was before brokers could be asked
            proof = sign_location(
                self.trust.identity.private_key, frame.token, service, me, frame.origin
            )
            self._send(came_from, LocatedFrame(frame.token, service, me, proof))
            return None
        route = self.routes.find(service, None)
        address = None if route is None else route_address(route.address, service)
        if route is None or route.address == "LOCAL" or address is None:
            return self._refuse(
                service,
                f"broker {me} forwards, but no route there leads to service '{service}':"
                f" create_route for it on broker {me}",
            )
        if frame.hops + 1 >= MAX_LOCATE_HOPS:
            return f"service '{service}' was not found within {MAX_LOCATE_HOPS} brokers"
        hop = self.peers.address_peer.get(address)
        if hop == came_from.instance:
            return self._refuse(
                service,
                f"the routes for service '{service}' form a loop: broker {me} would send the"
                f" question back to broker {hop}; check the routes on the way",
            )
        peer = None if hop is None else self.peers.all.get(hop)
        link = None if peer is None else peer.link
        if link is None or not link.established:
            held = self.held.setdefault(address, [])
            if len(held) < MAX_RELAYED:
                held.append((frame, came_from.instance))  # relayed once connected
            self.links.connect(address)
            return None
        return self._relay(frame, came_from.instance, link)

    def link_up(self, address: str, link: Link) -> None:
        """The connection to `address` is up: the questions held for it go on."""
        for frame, came_from in self.held.pop(address, ()):
            reason = self._relay(frame, came_from, link)
            if reason is not None:
                peer = self.peers.all.get(came_from)
                self._send(peer, LocatedFrame(frame.token, frame.service, None, None, reason))

    def _relay(self, frame: LocateFrame, came_from: uuid.UUID, link: Link) -> str | None:
        """Pass `frame` on to the next hop on `link`, remembering where it came from."""
        if link.connection.peer_version < LOCATE_VERSION:
            return (
                f"broker {link.peer.instance if link.peer else link.address} on the way to"
                f" service '{frame.service}' speaks protocol version"
                f" {link.connection.peer_version}: name the broker instance in the route"
            )
        now = self.clock.time()
        relayed = self.relayed
        if len(relayed) >= MAX_RELAYED:
            horizon = now - 2 * self.settings.retry_max
            for token in [t for t, (_, at) in relayed.items() if at < horizon]:
                del relayed[token]
            if len(relayed) >= MAX_RELAYED:
                return None  # the origin asks again later
        relayed[frame.token] = (came_from, now)
        link.write(
            link.connection.send(
                LocateFrame(frame.token, frame.service, frame.origin, frame.hops + 1)
            )
        )
        return None

    def _refuse(self, service: str, reason: str) -> str:
        self._say(f"refuse:{service}", "a broker asked where service '%s' is: %s", service, reason)
        return reason

    def _send(self, peer: Peer | None, frame: LocatedFrame) -> None:
        link = None if peer is None else peer.link
        if link is not None and link.established:
            link.write(link.connection.send(frame))

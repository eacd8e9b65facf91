"""Outbound: transmission-queue work placed on peers and fed to their dialog senders.

Theory of operation. The core keeps messages for other brokers in its durable
transmission queue, one outbox per dialog direction (see `_core.delivery`), and tells
the transport (`outbound`). Once the store batch holding the entries is durable,
`place` finds the direction's peer (the broker its route or conversation names, or, for
a route that names none, the one that hosts the service along the route, see `locator`)
or records why it waits: no route, no trusted certificate, an encrypted dialog whose
binding names another broker, no answer yet about where the service is (all in
`unrouted`), or an address not yet known as a broker (`waiting` for its connection).
A missing route or certificate is logged once, until a direction finds it.

`feed` pulls durable entries into each direction's `DialogSender` (opened on first use
with a fresh session key, wrapped for the peer's or the binding's certificate, signed by
this broker as the origin and persisted), in order, while the peer's in-flight budget
(IN_FLIGHT_MESSAGES, IN_FLIGHT_BYTES: what the senders hold unacknowledged, as the
dialog layer counts it) allows: memory holds what is in flight, not the backlog. A
direction the budget leaves out gets its first entry from a small reserve, so that the
dialog layer's priorities and starvation bound apply to it too. The pump writes what
the senders have (see `pump`). A `MessageAcked` (a run of messages) deletes them from
the transmission queue (contiguous runs in one delete) and feeds more; an acknowledged
EndDialog or Error lets the ending endpoint close. Its sender goes with it, or, when
messages ahead of the EndDialog are still unacknowledged (acks may come out of order),
with the ack of the last of them.

Restart: a sender resumes at its direction's first unacknowledged message (numbers in
between that were acknowledged out of order are skipped, see `DialogSender.skip_to`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Final

from ssb.protocol import (
    Direction,
    Envelope,
    MessageAcked,
    new_session_key,
    pack,
    sign_origin,
    wrap_session_key,
)

from .._core.catalog import Route
from .._core.conversations import Endpoint
from .._core.delivery import SYSTEM_TYPES
from .._core.ports import EndpointLookup, RouteLookup
from .._core.remote import RemoteDelivery
from .._core.transmission import DialogOutbox, DirectionKey, Outbound
from .applying import Applying, DirectionId
from .link import Link, Links, Peer
from .locator import Locator
from .peers import Peers, route_address
from .ports import Clock, RemoteDialog, RemoteDialogStore
from .pump import Pump
from .refusals import RefusalLog, SaidOnce
from .settings import TransportSettings, transmission_priority
from .trust import Trust

log = logging.getLogger("ssb.transport")

IN_FLIGHT_MESSAGES: Final = 8192  # messages pulled into a peer's senders and not yet acked
IN_FLIGHT_BYTES: Final = 64 * 1024 * 1024  # their bodies
# beyond them, for the first entry of directions the budget left out (see _feed_first)
RESERVE_MESSAGES: Final = 1024
RESERVE_BYTES: Final = 16 * 1024 * 1024
FEED_CHUNK: Final = 256  # messages pulled from one direction per turn


@functools.lru_cache(maxsize=1024)
def _instance_id(text: str) -> uuid.UUID:
    return uuid.UUID(text)


def _leads_nowhere(route: Route, service: str) -> str:
    """Why `route`, the best for `service`, names no broker to send its messages to."""
    if route.address == "LOCAL":
        return (
            f"route '{route.name}' is LOCAL, but this broker has no service '{service}':"
            " create the service here, or alter the route"
        )
    return (
        f"route '{route.name}' is TRANSPORT, but the service name '{service}' is no address"
        " (tcp://HOST:PORT): create_route for it"
    )


def _direction(from_initiator: bool) -> Direction:
    return Direction.FROM_INITIATOR if from_initiator else Direction.FROM_TARGET


@dataclasses.dataclass(eq=False)
class Transmission:
    """Where each direction's transmission-queue entries go, and how many are in flight."""

    instance: uuid.UUID
    delivery: RemoteDelivery
    endpoints: EndpointLookup
    routes: RouteLookup
    store: RemoteDialogStore
    clock: Clock
    trust: Trust
    peers: Peers
    links: Links
    pump: Pump
    refusals: RefusalLog
    settings: TransportSettings
    # the envelope of a direction from another broker
    incoming: Callable[[DirectionId], Envelope | None]
    locator: Locator

    def __post_init__(self) -> None:
        # outboxes waiting to learn which broker an address is
        self.waiting: dict[str, dict[DirectionKey, DialogOutbox]] = {}
        self.unrouted: dict[DirectionKey, DialogOutbox] = {}  # no route (yet), or refused
        # told of, to place once durable: by the store batch their entries are in, in the
        # order they were told of (a dict as an ordered set)
        self._fresh: dict[int, dict[DialogOutbox, None]] = {}
        self._say = SaidOnce()  # why directions wait, logged once each until resolved
        # directions waiting in `unrouted` for the answer of a lookup (service, address)
        self.locating: dict[tuple[str, str], set[DirectionKey]] = {}
        # senders whose endpoint went while messages were unacked (an EndDialog acked
        # before a message ahead of it), or restored without one to finish their entries:
        # each goes with the ack of its last message
        self._ended: dict[DirectionId, Peer] = {}

    # ---- placing ---------------------------------------------------------------------

    def outbound(self, box: DialogOutbox) -> None:
        """The core put entries for another broker in `box`; they go once durable (a message
        sent before its sender's commit could reach the peer, be lost here in a crash, and its
        sequence number be used again for another message)."""
        batch = self.store.watermark()
        fresh = self._fresh.get(batch)
        if fresh is None:
            fresh = self._fresh[batch] = {}
            self.store.when_durable(batch, lambda: self._place_soon(batch))
        fresh[box] = None

    def _place_soon(self, durable: int) -> None:
        # in the loop's next turn: the senders' answers, waiting for the same batch, go first
        self.clock.call_soon(self._place_fresh, durable)

    def _place_fresh(self, durable: int) -> None:
        """Batch `durable` is durable: place the boxes told of up to it (those of a later
        batch wait for theirs; placed now they would find nothing to pull, and nothing
        would feed them again while their link is idle)."""
        for batch in [b for b in self._fresh if b <= durable]:
            for box in self._fresh.pop(batch):
                self.place(box)

    def place_all(self) -> None:
        """Place every direction with entries for another broker (at start)."""
        for box in self.delivery.remote_outboxes():
            self.place(box)

    def place(self, box: DialogOutbox) -> None:
        """Find the peer of a direction's entries and feed it, or record why they wait."""
        if self.links.closing or box.local or not self.delivery.is_current(box):
            return
        key = box.direction
        route = self.routes.find(box.to_service, box.to_broker_instance)
        address = None if route is None else route_address(route.address, box.to_service)
        if route is None:
            box.status = f"no route to service '{box.to_service}'"
            self.unrouted[key] = box
            self._say(
                f"route:{box.to_service}",
                "messages for service '%s' wait in the transmission queue: no route leads to"
                " it; they go once one does (create_route)",
                box.to_service,
            )
            return
        if address is None:
            box.status = _leads_nowhere(route, box.to_service)
            self.unrouted[key] = box
            self._say(
                f"route:{box.to_service}",
                "messages for service '%s' wait in the transmission queue: %s",
                box.to_service,
                box.status,
            )
            return
        self.unrouted.pop(key, None)
        self._say.resolved(f"route:{box.to_service}")
        box.status = ""
        named = box.to_broker_instance or route.broker_instance or self._far_broker(key)
        if named:
            instance = _instance_id(named)
        else:
            found = self._located(box, address)
            if found is None:
                return
            instance = found
        peer = self.peers.get(instance)
        if peer is None and named:
            box.status = (
                f"no certificate of broker {named} is trusted here: create_certificate with"
                " its broker_certificate()"
            )
            self._say(
                f"certificate:{named}",
                "messages for service '%s' wait in the transmission queue: %s",
                box.to_service,
                box.status,
            )
        if peer is None:
            self.waiting.setdefault(address, {})[key] = box
            self.links.connect(address)
            return
        self._say.resolved(f"certificate:{peer.instance}")
        opened = peer.dialog.sender(key[0], _direction(key[1])) is not None
        refusal = None if opened else self.trust.encryption_refusal(box, peer.instance)
        if refusal is not None:
            box.status = refusal
            self.unrouted[key] = box
            self.refusals(
                (key[0], _direction(key[1])), "conversation %s waits: %s", key[0], refusal
            )
            return
        peer.address = address
        peer.boxes[key] = box
        self.feed(peer)
        self._feed_first(peer, key, box)

    def _far_broker(self, key: DirectionKey) -> str | None:
        """The broker a direction's conversation is with, once that is known."""
        ep = self.endpoints.by_conversation(key[0], key[1])
        return None if ep is None else ep.far_broker_instance

    def _located(self, box: DialogOutbox, address: str) -> uuid.UUID | None:
        """The broker that hosts the service of `box` along its route to `address` (which
        names none), once the broker there said so (see `locator`); None: the box waits
        for the connection to `address` or for the answer."""
        key = box.direction
        adjacent = self.peers.address_peer.get(address)
        peer = None if adjacent is None else self.peers.all.get(adjacent)
        if peer is None or peer.link is None or not peer.link.established:
            self.waiting.setdefault(address, {})[key] = box
            self.links.connect(address)
            return None
        found = self.locator.far_broker(box.to_service, address, peer)
        if found is None:
            box.status = self.locator.status(box.to_service, address)
            self.unrouted[key] = box
            self.locating.setdefault((box.to_service, address), set()).add(key)
        return found

    def located(self, service: str, address: str) -> None:
        """The lookup of `service` along `address` was answered: place what waited."""
        for key in self.locating.pop((service, address), ()):
            box = self.unrouted.pop(key, None)
            if box is not None:
                self.place(box)

    def wants_location(self, service: str, address: str) -> bool:
        """Whether a direction still waits for the lookup of `service` along `address`
        (directions that ended meanwhile are forgotten here)."""
        place = (service, address)
        live = set()
        for key in self.locating.get(place, ()):
            box = self.unrouted.get(key)
            if box is not None and self.delivery.is_current(box):
                live.add(key)
            else:
                self.unrouted.pop(key, None)  # its dialog ended, or its entries went
        if live:
            self.locating[place] = live
        else:
            self.locating.pop(place, None)
        return bool(live)

    def replace_all(self) -> None:
        """Routes or trust changed: place again every direction that waits."""
        boxes = list(self.unrouted.values())
        for waiting in self.waiting.values():
            boxes += waiting.values()
        self.unrouted.clear()
        self.waiting.clear()
        self.locating.clear()
        for box in boxes:
            self.place(box)

    def address_known(self, address: str) -> None:
        """A connection to `address` is up (or may be, after a backoff): place what waited
        to learn which broker is there."""
        for box in self.waiting.pop(address, {}).values():
            self.place(box)

    def waits_for(self, address: str) -> bool:
        return bool(self.waiting.get(address))

    def describe(self, out: Outbound) -> str:
        """Why an entry waits, in words (empty when it is on its way)."""
        waiting = self.unrouted.get((out.conversation_id, out.is_initiator))
        if waiting is not None and waiting.status:
            return waiting.status
        route = self.routes.find(out.to_service, out.to_broker_instance)
        if route is None:
            return f"no route to service '{out.to_service}'"
        address = route_address(route.address, out.to_service)
        if address is None:
            return _leads_nowhere(route, out.to_service)
        return self.links.connect_errors.get(address, "")

    # ---- feeding senders within the in-flight budget ----------------------------------

    def feed(self, peer: Peer) -> None:
        """Pull durable entries into the peer's senders while its budget allows."""
        delivery = self.delivery
        boxes = peer.boxes
        now = self.clock.time()
        dialog = peer.dialog
        for key, box in list(boxes.items()):
            room = IN_FLIGHT_MESSAGES - dialog.unacked_messages
            room_bytes = IN_FLIGHT_BYTES - dialog.unacked_bytes
            if room <= 0 or room_bytes <= 0:
                break
            if not delivery.is_current(box):
                del boxes[key]
                continue
            entries = delivery.pull(box, min(room, FEED_CHUNK), room_bytes)
            if entries:
                self._queue(peer, entries, now)
            if not delivery.is_current(box):
                del boxes[key]  # all pulled: a later entry makes a new outbox
            elif entries:
                del boxes[key]
                boxes[key] = box  # round robin among directions
        self.pump.soon(peer)

    def _feed_first(self, peer: Peer, key: DirectionKey, box: DialogOutbox) -> None:
        """A direction the in-flight budget left out, with nothing in flight, gets its first
        entry from a small reserve, so that the dialog layer's priorities and starvation
        bound see it: fed in turn, a low-priority direction placed behind a large
        backlog would wait for all of it, whatever the bound."""
        if peer.boxes.get(key) is not box:
            return  # fed whole already
        sender = peer.dialog.sender(key[0], _direction(key[1]))
        if sender is not None and sender.unacked_count:
            return
        if (
            peer.dialog.unacked_messages >= IN_FLIGHT_MESSAGES + RESERVE_MESSAGES
            or peer.dialog.unacked_bytes >= IN_FLIGHT_BYTES + RESERVE_BYTES
        ):
            return
        entries = self.delivery.pull(box, 1, RESERVE_BYTES)
        if entries:
            self._queue(peer, entries, self.clock.time())
        if not self.delivery.is_current(box):
            del peer.boxes[key]
        self.pump.soon(peer)

    def _queue(self, peer: Peer, entries: list[Outbound], now: float) -> None:
        """Entries of one direction, in order, into its sender (opened on the first)."""
        first = entries[0]
        conversation_id = first.conversation_id
        direction = _direction(first.is_initiator)
        dialog = peer.dialog
        peer.services.add(first.to_service)
        sender = dialog.sender(conversation_id, direction)
        if sender is None:
            self._open_sender(peer, first, direction)
            sender = dialog.sender(conversation_id, direction)
            assert sender is not None
        start = sender.next_seq
        run: list[tuple[str, bytes]] = []
        for out in entries:
            seq = start + len(run)
            if out.seq < seq:
                continue  # already on its way (a duplicate pull cannot happen; kept safe)
            if out.seq > seq:  # acknowledged out of order before a restart
                if run:
                    dialog.queue_messages(conversation_id, direction, start, run, now)
                    run = []
                sender.skip_to(out.seq)
                start = out.seq
            run.append((out.message_type, out.body))
        if run:
            dialog.queue_messages(conversation_id, direction, start, run, now)

    def _open_sender(self, peer: Peer, out: Outbound, direction: Direction) -> None:
        """A direction's first message to `peer`: its sender, with a new session key."""
        incoming = (
            None if out.is_initiator else self.incoming((out.conversation_id, direction.reverse))
        )
        encrypted, recipient = self.trust.recipient(out, peer.certificate_pem, incoming)
        envelope = Envelope(
            out.from_service, out.to_service, out.contract, self.instance, peer.instance, encrypted
        )
        key = new_session_key()
        wrapped = wrap_session_key(key, recipient)
        # the origin's signature, so that the target can tell, when the dialog reaches
        # it through a forwarder, that no one on the way put in a key of its own
        transcript = envelope.origin_transcript(out.conversation_id, direction, wrapped)
        envelope = dataclasses.replace(
            envelope, origin_proof=sign_origin(self.trust.identity.private_key, transcript)
        )
        peer.dialog.open_sender(
            out.conversation_id,
            direction,
            envelope,
            session_key=key,
            wrapped_session_key=wrapped,
            next_seq=out.seq,
            priority=self._priority(out.priority),
            now=self.clock.time(),
        )
        self.store.put_remote_dialog(
            (
                out.conversation_id,
                int(direction),
                "send",
                str(peer.instance),
                key,
                wrapped,
                out.seq,
                pack(envelope.encode()),
            )
        )
        self.endpoints.set_far_broker(out.conversation_id, out.is_initiator, str(peer.instance))

    def _priority(self, level: int) -> int:
        return transmission_priority(level, self.settings.honor_broker_priority)

    # ---- acknowledgements -------------------------------------------------------------

    def acked(self, peer: Peer, event: MessageAcked, link: Link | None, applying: Applying) -> None:
        """The far broker stored messages (the dialog layer freed their budget): their
        transmission-queue entries go (contiguous user messages of a direction in one
        delete, at the end of the events: `flush_acked`)."""
        key = (event.conversation_id, event.direction)
        acked = applying.acked
        span = acked.get(key)
        mtype = event.message_type
        if span is not None and span[1] + 1 == event.seq and mtype not in SYSTEM_TYPES:
            span[1] = event.last
            return
        if span is not None:
            del acked[key]
            self._acknowledged(key, span[0], span[1])
        if mtype in SYSTEM_TYPES:  # may close the sender: after the range before it
            self._acknowledged(key, event.seq, event.last, mtype)
        else:
            acked[key] = [event.seq, event.last]

    def flush_acked(self, applying: Applying) -> None:
        for key, span in applying.acked.items():
            self._acknowledged(key, span[0], span[1])
        applying.acked.clear()

    def _acknowledged(
        self, key: DirectionId, first: int, last: int, message_type: str = ""
    ) -> None:
        """The far broker stored messages `first`..`last` of direction `key`."""
        self.delivery.remote_acknowledged(
            key[0], key[1] is Direction.FROM_INITIATOR, first, last, message_type
        )
        if self._ended and key in self._ended:
            sender = self._ended[key].dialog.sender(*key)
            box = self.delivery.outbox((key[0], key[1] is Direction.FROM_INITIATOR))
            if sender is None or (sender.unacked_count == 0 and (box is None or not box.count)):
                self._close_sender(self._ended[key], *key)  # nothing left to send

    # ---- senders at restart and when their endpoint goes ---------------------------------

    def restore(self, peer: Peer, remote: RemoteDialog) -> None:
        """A sender from its persisted state: it resumes at the direction's first entry
        still in the transmission queue (else after what its endpoint sent)."""
        conversation_id, direction, envelope = (
            remote.conversation_id,
            remote.direction,
            remote.envelope,
        )
        assert envelope is not None  # (a sender's row keeps its routing header)
        from_initiator = direction is Direction.FROM_INITIATOR
        box = self.delivery.outbox((conversation_id, from_initiator))
        ep = self.endpoints.by_conversation(conversation_id, from_initiator)
        if (box is None or box.local) and ep is None:
            self.store.delete_remote_dialog(conversation_id, int(direction), "send")
            return
        first = box.first_key() if box is not None and not box.local else None
        resume = first if first is not None else (ep.send_seq if ep else 0)
        if ep is None:  # restored only to finish its entries: it goes with their last ack
            self._ended[(conversation_id, direction)] = peer
        peer.dialog.open_sender(
            conversation_id,
            direction,
            envelope,
            session_key=remote.session_key,
            wrapped_session_key=remote.wrapped_key,
            next_seq=resume,
            priority=self._priority(box.priority if box is not None else 5),
            now=self.clock.time(),
        )
        peer.services.add(envelope.to_service)

    def endpoint_removed(self, peer: Peer, ep: Endpoint) -> None:
        """A local endpoint closed: its sender to `peer` goes once nothing is unacked."""
        key = (ep.conversation_id, _direction(ep.is_initiator))
        sender = peer.dialog.sender(*key)
        if sender is None:
            return
        if sender.unacked_count == 0:
            self._close_sender(peer, *key)
        else:
            self._ended[key] = peer

    def _close_sender(self, peer: Peer, conversation_id: uuid.UUID, direction: Direction) -> None:
        peer.dialog.close_sender(conversation_id, direction)
        self._ended.pop((conversation_id, direction), None)
        self.store.delete_remote_dialog(conversation_id, int(direction), "send")

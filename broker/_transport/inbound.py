"""Inbound: frames from other brokers to dialog events, and each event to the core and store.

Theory of operation. The frames of one read (a slice of it, see `link`) are taken
together. Each goes to the broker whose dialog it belongs to (see `peers`; a bundle too,
which a forwarder may have relayed), or, a frame of other brokers' dialogs, to the
forwarder when forwarding is on (the read's together, after the rest). Before the dialog
layer sees a fragment, the core says whether a message for that direction could be
stored now (`_refused`): a fragment for a full queue, or while the disk is full, is
dropped unacknowledged and the sender retries with its usual backoff (the read's
messages not yet delivered count as if they were in their queues). A full queue is
logged per direction; a full disk, the whole broker's, in one line for every direction
(both at most once a REFUSAL_LOG_EVERY).

A message for a service of this broker needs SEND permission on it for the login its
sending broker's certificate names (PUBLIC when none), as in Service Broker: without it
the dialog ends with Service Broker's error 11215 (`_permitted`), and the rest of the
direction is acknowledged and dropped. EndDialog and Error always pass.

The dialog layer turns frames into events, and `apply` hands each event to its handler
(the table in `Reception.__init__`; an unknown event raises). A `MessageReceived` (or a
bundle's `MessagesReceived`) goes to the core, consecutive messages of a direction and
type in one delivery (the core creates the target endpoint with the first message, or
holds messages while the target queue is OFF); fragments of incomplete messages are held
in the store; a `MessageAcked` is outbound's (see `outbound`); a frame of a direction
without a receiver may open one (see `receivers`). The receivers' next sequence numbers
are persisted in the store's open batch, each direction's once, as the batch is taken
(it holds many reads). Only when that batch is durable does the dialog layer learn that
the events were stored (once per broker and batch: each direction's last message, and
the fragments held), so no ack ever leaves for something a crash could lose.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from ssb.protocol import (
    AckFrame,
    BundleFrame,
    DialogEvent,
    Direction,
    Envelope,
    FragmentFrame,
    FragmentReceived,
    HeldFragment,
    IntegrityFailure,
    MessageAcked,
    MessageReceived,
    MessagesReceived,
    PartialMessageDiscarded,
    ProtocolError,
    SessionKeyReceived,
    UnknownDialog,
    pack,
)

from .._core.delivery import NO_SEND_PERMISSION_ERROR, SYSTEM_TYPES
from .._core.ports import EndpointLookup, Row
from .._core.remote import RemoteDelivery
from .applying import Applying, Arrivals, DirectionId
from .forwarding import Forwarder
from .link import Frames, Link, Peer
from .outbound import Transmission
from .peers import Peers
from .ports import Clock, RemoteDialogStore
from .pump import Pump
from .receivers import Receivers
from .refusals import RefusalLog

log = logging.getLogger("ssb.transport")

Handler = Callable[[Peer, Any, "Link | None", Applying], None]
# the refusal log's key for what the whole broker refuses (no dialog has this id)
BROKER_WIDE: Final = (uuid.UUID(int=0), Direction.FROM_INITIATOR)


@functools.lru_cache(maxsize=1024)
def _instance_text(instance: uuid.UUID) -> str:
    return str(instance)


@dataclass(eq=False)
class Reception:
    """What other brokers send: frames to events, events to the core and the store.

    `login_of`: the login a broker's messages act as (None: PUBLIC); `may_send`: whether
    a login may SEND to a service of this broker."""

    delivery: RemoteDelivery
    endpoints: EndpointLookup
    store: RemoteDialogStore
    clock: Clock
    peers: Peers
    receivers: Receivers
    transmission: Transmission
    pump: Pump
    forwarder: Forwarder | None
    refusals: RefusalLog
    login_of: Callable[[uuid.UUID], str | None]
    may_send: Callable[[str | None, str], bool]

    def __post_init__(self) -> None:
        # read on every message; the receivers keep them
        self.envelopes = self.receivers.envelopes
        self.discarding = self.receivers.discarding
        # (conversation, direction, seq) of messages with fragments held in the store
        self.held_seqs: set[tuple[uuid.UUID, Direction, int]] = set()
        # each direction's next sequence number, written once per batch (`_write_next_seqs`)
        self._next_seqs: dict[DirectionId, int] = {}
        # what the reads of the store's open batch reported, per broker (`_when_stored`)
        self._storing_batch = -1
        self._storing: dict[
            Peer,
            tuple[dict[DirectionId, MessageReceived | MessagesReceived], list[FragmentReceived]],
        ] = {}
        self._handlers: dict[type[DialogEvent], Handler] = {
            MessageReceived: self._message_received,
            MessagesReceived: self._messages_received,
            FragmentReceived: self._fragment_received,
            MessageAcked: self.transmission.acked,
            SessionKeyReceived: self._session_key_received,
            PartialMessageDiscarded: self._partial_discarded,
            IntegrityFailure: self._integrity_failure,
            UnknownDialog: self._unknown_dialog,
        }

    # ---- frames ----------------------------------------------------------------------

    def frames(self, link: Link, frames: Frames) -> None:
        """Frames from one read: their events are applied (and stored) together, per
        broker the dialogs are with; other brokers' frames go to the forwarder."""
        adjacent = link.peer
        if adjacent is None:
            return
        now = self.clock.time()
        forwarder = self.forwarder
        far = self.peers.far
        applying: dict[Peer, Applying] = {}

        def pending() -> tuple[int, int]:
            """The read's messages not yet delivered, and their bytes."""
            bodies = [b for w in applying.values() for g in w.arrivals.values() for b in g.bodies]
            return len(bodies), sum(map(len, bodies))

        relaying: list[FragmentFrame | BundleFrame | AckFrame] = []
        for frame in frames:
            peer: Peer | None
            if forwarder is not None and forwarder.wants(frame):
                relaying.append(frame)  # all together at the end of the read
                continue
            peer = far.get(frame.conversation_id)
            if peer is None:
                peer = self.peers.partner(adjacent, frame)
                if peer is None:
                    continue
            # one frame at a time: a queue a message just filled refuses the next one (the
            # read's messages not yet delivered count as if they were in their queues)
            if not isinstance(frame, AckFrame) and self._refused(peer, frame, pending):
                continue
            try:
                events = peer.dialog.receive_frame(frame, now)
            except ProtocolError as exc:
                log.warning("dropping a bad frame from broker %s: %s", peer.instance, exc)
                continue
            if peer is not adjacent and not any(isinstance(e, IntegrityFailure) for e in events):
                # a frame the far broker sealed came this way: its frames go back so too
                far[frame.conversation_id] = peer
                peer.via = adjacent.instance
            work = applying.get(peer)
            if work is None:
                work = applying[peer] = Applying()
            self.apply(peer, events, link, work)
        if relaying:
            assert forwarder is not None
            forwarder.relay_all(relaying, adjacent.instance, now)
        for peer, work in applying.items():
            self._applied(peer, work)
            if peer.boxes:
                self.transmission.feed(peer)
            else:
                self.pump.soon(peer)

    def _refused(
        self,
        peer: Peer,
        frame: FragmentFrame | BundleFrame,
        pending: Callable[[], tuple[int, int]],
    ) -> bool:
        """Whether a message of this fragment's direction could not be stored now (a full
        queue or disk): then it is dropped unacknowledged, and the sender retries."""
        key = (frame.conversation_id, frame.direction)
        if key in self.discarding:
            return False
        envelope = frame.envelope or self.envelopes.get(key)
        reason = self.delivery.accepts(
            frame.conversation_id,
            frame.direction is Direction.FROM_INITIATOR,
            envelope.to_service if envelope else "",
            pending,
            len(frame.payloads) if isinstance(frame, BundleFrame) else 1,
        )
        if reason is None:
            return False
        peer.refused_fragments += 1
        if reason == self.delivery.capacity.refusal:  # the whole broker's: one line for all
            self.refusals(
                BROKER_WIDE,
                "not acknowledging messages from other brokers: %s (they retry)",
                reason,
                level=logging.INFO,
            )
            return True
        self.refusals(
            key,
            "not acknowledging messages of conversation %s from broker %s: %s (it retries)",
            frame.conversation_id,
            peer.instance,
            reason,
            level=logging.INFO,
        )
        return True

    # ---- events ----------------------------------------------------------------------

    def apply(
        self,
        peer: Peer,
        events: Iterable[DialogEvent],
        link: Link | None = None,
        applying: Applying | None = None,
    ) -> None:
        """Hand the dialog layer's events to their handlers; with `applying`, leave the
        writes that can wait for the end of the read to it (`_applied`)."""
        own = applying is None
        if applying is None:
            applying = Applying()
        handlers = self._handlers
        arrivals = applying.arrivals
        for event in events:
            kind = type(event)
            if (
                kind is not MessagesReceived
                and kind is not MessageReceived
                and kind is not FragmentReceived
                and arrivals
            ):
                self._deliver(applying)  # what came before it, first
            handlers[kind](peer, event, link, applying)
        if applying.acked:
            self.transmission.flush_acked(applying)
        if own:
            self._applied(peer, applying)

    def _message_received(
        self, peer: Peer, event: MessageReceived, link: Link | None, applying: Applying
    ) -> None:
        """A message complete and in order: gathered with the ones before it of the same
        direction and type (or delivered alone when the dialog layer rejected it)."""
        key = (event.conversation_id, event.direction)
        if key not in self.discarding:
            envelope = self.envelopes.get(key)
            if envelope is not None and not event.rejected:
                self._gather(applying, key, envelope, event.message_type, event.seq, (event.body,))
            elif envelope is not None:
                self._deliver(applying, key)
                self.delivery.deliver_remote(
                    event.conversation_id,
                    event.direction is Direction.FROM_INITIATOR,
                    event.seq,
                    event.message_type,
                    event.body,
                    envelope.from_service,
                    envelope.to_service,
                    envelope.contract,
                    str(envelope.from_broker_id),
                    event.rejected,
                )
                if envelope.encrypted:
                    self._mark_encrypted(key)
                if event.rejected:
                    log.warning(
                        "conversation %s from broker %s ended: %s",
                        event.conversation_id,
                        peer.instance,
                        event.rejected,
                    )
            self._taken(applying, key, event.seq, event.seq)
        applying.received[key] = event  # its ack covers the direction's earlier ones

    def _messages_received(
        self, peer: Peer, event: MessagesReceived, link: Link | None, applying: Applying
    ) -> None:
        """A bundle's messages, complete and in order: gathered as one message is."""
        key = (event.conversation_id, event.direction)
        if key not in self.discarding:
            envelope = self.envelopes.get(key)
            if envelope is not None:
                self._gather(applying, key, envelope, event.message_type, event.seq, event.bodies)
            self._taken(applying, key, event.seq, event.last)
        applying.received[key] = event  # its ack covers the direction's earlier ones

    def _gather(
        self,
        applying: Applying,
        key: DirectionId,
        envelope: Envelope,
        message_type: str,
        seq: int,
        bodies: tuple[bytes, ...],
    ) -> None:
        """Messages `seq`.. of a direction join the ones gathered before them for one
        delivery, when they follow them and are of their type (else those go first)."""
        arrivals = applying.arrivals
        group = arrivals.get(key)
        if group is not None and (
            group.message_type != message_type or group.seq + len(group.bodies) != seq
        ):
            self._deliver(applying, key)
            group = None
        if group is None:
            arrivals[key] = Arrivals(message_type, seq, list(bodies), envelope)
        else:
            group.bodies += bodies

    def _taken(self, applying: Applying, key: DirectionId, first: int, last: int) -> None:
        """Messages `first`..`last` of a direction are taken: its next sequence number
        follows them, and fragments held of them go."""
        applying.next_seqs[key] = last + 1
        if self.held_seqs:
            for seq in range(first, last + 1):
                held = (key[0], key[1], seq)
                if held in self.held_seqs:
                    self.held_seqs.discard(held)
                    self.store.delete_held_message(key[0], int(key[1]), seq)

    def _fragment_received(
        self, peer: Peer, event: FragmentReceived, link: Link | None, applying: Applying
    ) -> None:
        """A fragment of a message not yet complete: held in the store."""
        key = (event.conversation_id, event.direction)
        if key not in self.discarding:
            self.store.put_held_fragment(
                (
                    key[0],
                    int(key[1]),
                    event.seq,
                    event.fragment_index,
                    event.fragment_count,
                    event.message_type,
                    event.payload,
                )
            )
            self.held_seqs.add((key[0], key[1], event.seq))
        applying.fragments.append(event)

    def _session_key_received(
        self, peer: Peer, event: SessionKeyReceived, link: Link | None, applying: Applying
    ) -> None:
        """A direction's session key: persisted with the direction."""
        key = (event.conversation_id, event.direction)
        if key not in self.discarding:
            envelope = self.envelopes.get(key)
            self._next_seqs.pop(key, None)  # noted before the row: the row replaces it
            self.store.put_remote_dialog(
                (
                    key[0],
                    int(key[1]),
                    "recv",
                    str(peer.instance),
                    event.session_key,
                    None,
                    0,
                    None if envelope is None else pack(envelope.encode()),
                )
            )

    def _partial_discarded(
        self, peer: Peer, event: PartialMessageDiscarded, link: Link | None, applying: Applying
    ) -> None:
        self.store.delete_held_message(event.conversation_id, int(event.direction), event.seq)

    def _integrity_failure(
        self, peer: Peer, event: IntegrityFailure, link: Link | None, applying: Applying
    ) -> None:
        # counted against the broker it came from: through a forwarder, that one
        carrier = peer if link is None or link.peer is None else link.peer
        carrier.corrupt_fragments += 1
        if link is not None:
            link.connection.record_corrupt_fragment()
        through = "" if carrier is peer else f" through broker {carrier.instance}"
        log.warning(
            "corrupted fragment from broker %s%s (conversation %s, seq %s): %s",
            peer.instance,
            through,
            event.conversation_id,
            event.seq,
            event.reason,
        )

    def _unknown_dialog(
        self, peer: Peer, event: UnknownDialog, link: Link | None, applying: Applying
    ) -> None:
        """A frame of a direction without a receiver: it may open one (see `receivers`)."""
        opened = self.receivers.open(peer, event, link)
        if opened is not None:
            origin, batches = opened
            for events in batches:
                self.apply(origin, events, link)

    # ---- delivery and durability ------------------------------------------------------

    def _mark_encrypted(self, key: DirectionId) -> None:
        """The local endpoint of an encrypted dialog shows it (is_encrypted)."""
        self.endpoints.mark_encrypted(key[0], key[1] is Direction.FROM_TARGET)

    def _deliver(self, applying: Applying, only: DirectionId | None = None) -> None:
        """Hand the messages gathered in `applying` (of direction `only`, or all) to the core."""
        arrivals = applying.arrivals
        keys = list(arrivals) if only is None else [only] if only in arrivals else []
        deliver = self.delivery.deliver_remote_many
        for key in keys:
            group = arrivals.pop(key)
            envelope = group.envelope
            if not self._permitted(key, group):
                continue
            deliver(
                key[0],
                key[1] is Direction.FROM_INITIATOR,
                group.seq,
                group.message_type,
                group.bodies,
                envelope.from_service,
                envelope.to_service,
                envelope.contract,
                _instance_text(envelope.from_broker_id),
            )
            if envelope.encrypted:
                self._mark_encrypted(key)

    def _permitted(self, key: DirectionId, group: Arrivals) -> bool:
        """Whether the sending broker's login may SEND to the service these messages
        reach: the service of this broker's endpoint of the dialog (an initiator, for
        answers), or for a new dialog the one its first message names; if not, the dialog
        ends with Service Broker's error and the direction's later messages are
        acknowledged and dropped. EndDialog and Error pass only on a dialog this broker
        already has: one cannot open a dialog."""
        envelope = group.envelope
        here = self.endpoints.by_conversation(key[0], key[1] is Direction.FROM_TARGET)
        if here is not None and group.message_type in SYSTEM_TYPES:
            return True
        login = self.login_of(envelope.from_broker_id)
        if self.may_send(login, envelope.to_service if here is None else here.service):
            return True
        who = login or "public"
        self.refusals(
            key,
            "conversation %s from broker %s refused: its certificate's login %r lacks SEND on"
            " service %r (grant('SEND', %r, 'service', %r) lets it send)",
            key[0],
            envelope.from_broker_id,
            who,
            envelope.to_service,
            who,
            envelope.to_service,
        )
        self.discarding.add(key)
        self.delivery.deliver_remote(
            key[0],
            key[1] is Direction.FROM_INITIATOR,
            group.seq,
            group.message_type,
            group.bodies[0],
            envelope.from_service,
            envelope.to_service,
            envelope.contract,
            _instance_text(envelope.from_broker_id),
            "This message could not be delivered because the login of broker"
            f" {envelope.from_broker_id} does not have permission to send to the service."
            f" Service name: '{envelope.to_service}'.",
            NO_SEND_PERMISSION_ERROR,
        )
        return False

    def _applied(self, peer: Peer, applying: Applying) -> None:
        """A read's events were applied: deliver its messages, persist next sequence
        numbers, ack once durable."""
        if applying.arrivals:
            self._deliver(applying)
        if applying.next_seqs:
            if not self._next_seqs:
                self.store.defer(self._write_next_seqs)
            self._next_seqs.update(applying.next_seqs)
        if applying.stored:
            self._when_stored(peer, applying)

    def _write_next_seqs(self) -> None:
        """The open batch is being taken: each direction's last next sequence number in
        it, one write each (a batch holds many reads of a direction)."""
        pending, self._next_seqs = self._next_seqs, {}
        for (conversation_id, direction), next_seq in pending.items():
            self.store.set_remote_next_seq(conversation_id, int(direction), "recv", next_seq)

    def _when_stored(self, peer: Peer, applying: Applying) -> None:
        """Tell the dialog layer, once the open batch is durable, that what `applying`
        reported is stored: one callback per broker and batch, each direction's last
        message (the batch takes many reads)."""
        batch = self.store.watermark()
        if batch != self._storing_batch:
            self._storing_batch, self._storing = batch, {}
        waiting = self._storing.get(peer)
        if waiting is not None:
            waiting[0].update(applying.received)
            waiting[1].extend(applying.fragments)
            return
        waiting = self._storing[peer] = (dict(applying.received), list(applying.fragments))
        storing = self._storing

        def durable() -> None:
            if storing.get(peer) is waiting:
                del storing[peer]  # (durable already: a later read waits anew)
            received, fragments = waiting
            peer.dialog.mark_stored([*received.values(), *fragments], self.clock.time())
            self.pump.soon(peer)

        self.store.when_durable(batch, durable)

    # ---- restart ---------------------------------------------------------------------

    def restore_held(self, fragments: list[Row]) -> dict[DirectionId, list[HeldFragment]]:
        """The held fragments of every direction, from the store's rows."""
        held: dict[DirectionId, list[HeldFragment]] = {}
        for conv, direction, seq, index, count, mtype, payload in fragments:
            key = (uuid.UUID(bytes=conv), Direction(direction))
            held.setdefault(key, []).append(HeldFragment(seq, index, count, mtype, payload))
            self.held_seqs.add((key[0], key[1], seq))
        return held

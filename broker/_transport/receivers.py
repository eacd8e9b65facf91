"""Receivers: the dialog directions other brokers send on, opened, restored and closed.

Theory of operation. A direction from another broker is opened by the first frame of it
that passes the checks here (`open`), and nothing is kept unless that frame passes the
integrity check. A new dialog's first frames may arrive in any order (a corrupted or
lost fragment of message 0 is retried later), so a live dialog always starts at
sequence 0. A frame must carry a routing header (an envelope) addressed to this broker
to create anything; only the authenticated broker that is the other party of a
conversation sends on it, and the envelope must name that broker (`_not_party`). A
direction that reaches this broker through a forwarder is opened only with its origin's
signature over the envelope and wrapped session key (`_origin`).

A direction that ended here (or whose initiator is gone) is received in discard mode:
acknowledged and dropped, so that its sender stops; a receiver whose endpoint closed
lingers `closed_dialog_linger` seconds in that mode to ack late retransmissions.

Restart: receivers come back from their persisted next sequence number and held
fragments (`restore`). Messages still arriving (partial messages) are shown by the
views with where they will go (`partials`).

Owned here: the envelope of every direction received (where its messages go), the
directions in discard mode, and the conversations ended here lately.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ssb.protocol import (
    DialogEvent,
    Direction,
    Envelope,
    FragmentFrame,
    HeldFragment,
    IntegrityError,
    IntegrityFailure,
    PartialMessage,
    UnknownDialog,
    verify_origin,
)

from .._core.conversations import Endpoint
from .._core.ports import EndpointLookup, PeerCatalog
from .applying import DirectionId
from .link import Link, Peer
from .peers import Peers
from .ports import Clock, RemoteDialog, RemoteDialogStore
from .refusals import RefusalLog
from .settings import TransportSettings
from .trust import Trust

log = logging.getLogger("ssb.transport")


@dataclass(frozen=True)
class HeldPartial:
    """A message from another broker still arriving (Service Broker's status 2), and where
    it will go: the receiving endpoint if it exists yet, else the envelope's service."""

    queue: str | None
    handle: uuid.UUID | None
    group_id: uuid.UUID | None
    priority: int
    service: str
    contract: str
    from_service: str
    from_broker: str
    conversation_id: uuid.UUID
    message: PartialMessage


@dataclass(eq=False)
class Receivers:
    """The directions other brokers send to this one, and who may open one."""

    instance: uuid.UUID
    endpoints: EndpointLookup
    catalog: PeerCatalog
    store: RemoteDialogStore
    clock: Clock
    trust: Trust
    peers: Peers
    refusals: RefusalLog
    settings: TransportSettings
    envelopes: dict[DirectionId, Envelope] = field(init=False, default_factory=dict)
    discarding: set[DirectionId] = field(init=False, default_factory=set)
    # ended here recently
    closed_conversations: set[uuid.UUID] = field(init=False, default_factory=set)
    _closed_order: deque[tuple[float, uuid.UUID]] = field(init=False, default_factory=deque)

    # ---- opening ---------------------------------------------------------------------

    def open(
        self, peer: Peer, event: UnknownDialog, link: Link | None
    ) -> tuple[Peer, list[list[DialogEvent]]] | None:
        """The first frame of a direction `peer` has no receiver for: the receiver is
        opened if the frame may open it, and the broker the direction is with returned
        with the events to apply, batch by batch. None: refused (logged), nothing kept."""
        frame = event.frame
        key = (event.conversation_id, event.direction)
        envelope = frame.envelope
        adjacent = None if link is None else link.peer
        if (
            envelope is not None
            and adjacent is not None
            and envelope.from_broker_id != adjacent.instance
        ):
            # it came through a forwarder: the origin must prove it opened the direction
            origin = self._origin(adjacent, key, frame)
            if origin is None:
                return None
            if origin is not adjacent:
                self.peers.far[key[0]] = origin
                origin.via = adjacent.instance
            peer = origin
        dialog = peer.dialog
        if dialog.receiver(*key) is not None:
            # opened by an earlier frame of the same read
            return peer, [dialog.receive_frame(frame, self.clock.time())]
        if event.direction is Direction.FROM_INITIATOR:
            alive = key[0] not in self.closed_conversations
        else:
            alive = self.endpoints.by_conversation(key[0], True) is not None
        if alive and (envelope is None or envelope.to_broker_id != self.instance):
            return None  # cannot create an endpoint without a routing header addressed to us
        refusal = self._not_party(peer, key, envelope) if alive else None
        if refusal is not None:  # dropped unacknowledged: nothing of it is kept
            self.refusals(
                key,
                "refusing conversation %s from broker %s: %s",
                key[0],
                peer.instance,
                refusal,
            )
            return None
        first = 0 if alive else frame.seq
        events = dialog.open_receiver(key[0], key[1], next_expected_seq=first)
        followed = dialog.receive_frame(frame, self.clock.time())
        if any(isinstance(e, IntegrityFailure) for e in followed):
            dialog.close_receiver(*key)  # an unverified frame creates nothing
            return peer, [[e for e in followed if isinstance(e, IntegrityFailure)]]
        if alive:
            assert envelope is not None
            self.envelopes[key] = envelope
            self.discarding.discard(key)
        else:
            self.discarding.add(key)
        return peer, [events, followed]

    def _origin(self, adjacent: Peer, key: DirectionId, frame: FragmentFrame) -> Peer | None:
        """The broker a dialog direction that came through a forwarder (`adjacent`) comes
        from, if it proves itself: a certificate of it is trusted here and its signature
        over the envelope and wrapped session key verifies. None: refused (logged)."""
        envelope = frame.envelope
        assert envelope is not None
        origin = envelope.from_broker_id
        pem = self.trust.trusted_certificate(origin)
        refusal = None
        if pem is None:
            refusal = (
                f"no certificate of broker {origin} is trusted here (create_certificate with"
                " its broker_certificate())"
            )
        elif envelope.origin_proof is None or frame.wrapped_session_key is None:
            refusal = "it carries no origin proof"
        else:
            transcript = envelope.origin_transcript(key[0], key[1], frame.wrapped_session_key)
            try:
                verify_origin(pem, transcript, envelope.origin_proof)
            except IntegrityError:
                adjacent.corrupt_fragments += 1
                refusal = "its origin proof does not verify (altered on the way)"
        if refusal is not None:
            self.refusals(
                key,
                "refusing conversation %s from broker %s through broker %s: %s",
                key[0],
                origin,
                adjacent.instance,
                refusal,
            )
            return None
        return self.peers.get(origin, pem)

    def _not_party(self, peer: Peer, key: DirectionId, envelope: Envelope | None) -> str | None:
        """Why `peer` may not speak for this dialog direction (None: it may). Only the
        authenticated broker that is the other party of a conversation sends on it, and
        an envelope must name that broker as its sender (a forged one names another)."""
        if envelope is not None and envelope.from_broker_id != peer.instance:
            return f"its envelope names broker {envelope.from_broker_id} as the sender"
        known = self.envelopes.get(key)
        if known is not None and known.from_broker_id != peer.instance:
            return f"the conversation's messages come from broker {known.from_broker_id}"
        local = self.endpoints.by_conversation(key[0], key[1] is Direction.FROM_TARGET)
        if local is not None and local.far_broker_instance not in (None, str(peer.instance)):
            return f"the conversation is with broker {local.far_broker_instance}"
        if (
            local is not None
            and local.encrypted
            and local.is_initiator
            and not (envelope is not None and envelope.encrypted)
        ):
            return "the conversation is encrypted and its answers come in clear"
        return None

    # ---- restart -------------------------------------------------------------------------

    def restore(
        self, peer: Peer, remote: RemoteDialog, held: Iterable[HeldFragment]
    ) -> list[DialogEvent]:
        """A receiver from its persisted state; returns the events of what its held
        fragments complete."""
        envelope = remote.envelope
        if envelope is not None:
            self.envelopes[(remote.conversation_id, remote.direction)] = envelope
        return peer.dialog.open_receiver(
            remote.conversation_id,
            remote.direction,
            session_key=remote.session_key,
            next_expected_seq=remote.next_seq,
            encrypted=envelope is not None and envelope.encrypted,
            held_fragments=held,
        )

    # ---- closing ---------------------------------------------------------------------------

    def endpoint_removed(self, peer: Peer | None, ep: Endpoint) -> None:
        """A local endpoint closed: its incoming direction from `peer` is forgotten (its
        receiver lingers, acknowledging and dropping late retransmissions)."""
        conversation_id = ep.conversation_id
        key = (
            conversation_id,
            Direction.FROM_TARGET if ep.is_initiator else Direction.FROM_INITIATOR,
        )
        if peer is not None and peer.dialog.receiver(*key) is not None:
            self.discarding.add(key)
            self.clock.call_later(self.settings.closed_dialog_linger, self._close, peer, key)
        self._remember_closed(conversation_id)
        self.peers.far.pop(conversation_id, None)
        self.store.delete_remote_dialog(conversation_id, int(key[1]), "recv")
        self.store.delete_held_direction(conversation_id, int(key[1]))
        self.envelopes.pop(key, None)

    def _remember_closed(self, conversation_id: uuid.UUID) -> None:
        """Late frames of a dialog that ended here are discarded, for a while."""
        now = self.clock.time()
        self.closed_conversations.add(conversation_id)
        self._closed_order.append((now, conversation_id))
        horizon = now - 2 * self.settings.closed_dialog_linger
        while self._closed_order and self._closed_order[0][0] < horizon:
            self.closed_conversations.discard(self._closed_order.popleft()[1])

    def _close(self, peer: Peer, key: DirectionId) -> None:
        if key in self.discarding:
            peer.dialog.close_receiver(*key)
            self.discarding.discard(key)
            self.peers.far.pop(key[0], None)

    # ---- partial messages ------------------------------------------------------------------

    def partials(self) -> list[HeldPartial]:
        """Messages from other brokers that are still arriving, with where they go."""
        found = []
        for peer in self.peers.all.values():
            for receiver in peer.dialog.receivers():
                held = receiver.partials()
                key = (receiver.conversation_id, receiver.direction)
                if not held or key in self.discarding:
                    continue
                envelope = self.envelopes.get(key)
                ep = self.endpoints.by_conversation(key[0], key[1] is Direction.FROM_TARGET)
                service = ep.service if ep else envelope.to_service if envelope else ""
                queue = ep.queue if ep else self.catalog.service_queue(service)
                for message in held:
                    found.append(
                        HeldPartial(
                            queue,
                            ep.handle if ep else None,
                            ep.group_id if ep else None,
                            ep.priority if ep else 5,
                            service,
                            ep.contract if ep else envelope.contract if envelope else "",
                            ep.far_service if ep else envelope.from_service if envelope else "",
                            str(peer.instance),
                            key[0],
                            message,
                        )
                    )
        return found

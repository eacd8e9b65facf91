"""Dialog receiver: one dialog direction's ordering, reassembly and the ack it owes.

Theory of operation
-------------------
The receiver's rules:
  * A fragment is accepted only if its sealed MD5 signature verifies under the session
    key; otherwise it is dropped, not acked, and reported as `IntegrityFailure`.
  * A message is delivered (`MessageReceived`) only when complete and when every earlier
    message was delivered; a bundle that comes in order with nothing else waiting is
    delivered whole (`MessagesReceived`). Other accepted fragments are reported as
    `FragmentReceived` so the broker can hold them durably (status "disabled" in Service
    Broker's words).
  * An encrypted direction's message is decrypted when it is delivered. A body that does
    not decrypt (its signatures held, so the sender itself made it) is delivered as a
    `MessageReceived` with `rejected` set and an empty body: the broker ends the dialog
    with an error rather than deliver or drop it silently.
  * Nothing is acked before the broker reports it durable through `mark_stored`; the ack
    then confirms `below` (all messages < below delivered and stored) plus ranges of
    stored fragments beyond it.
  * Duplicates produce no event. A duplicate of something already stored makes the
    receiver ack again; a duplicate of something not yet stored is dropped silently (its
    ack follows the store).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Final

from cryptography.hazmat.primitives.asymmetric import rsa

from ._dialog_events import (
    DialogEvent,
    FragmentReceived,
    HeldFragment,
    IntegrityFailure,
    MessageReceived,
    MessagesReceived,
    PartialMessage,
    PartialMessageDiscarded,
    SessionKeyReceived,
)
from ._dialog_frames import AckFrame, AckRecord, BundleFrame, Direction, FragmentFrame
from ._errors import ErrorCode, IntegrityError, LocalProtocolError, RemoteProtocolError
from ._fields import MAX_ACK_RANGES
from ._integrity import BodyCipher, SessionSeal, unwrap_session_key

RECEIVE_WINDOW: Final = 8192
MAX_RECEIVE_WINDOW: Final = 1 << 20
MAX_BUFFERED_BYTES: Final = 256 * 1024 * 1024


def _unwrap_with_any(wrapped: bytes, keys: Sequence[rsa.RSAPrivateKey]) -> bytes:
    """The session key unwrapped with the first of `keys` that can.

    Raises: IntegrityError: none can.
    """
    for private_key in keys[:-1]:
        try:
            return unwrap_session_key(wrapped, private_key)
        except IntegrityError:
            continue
    return unwrap_session_key(wrapped, keys[-1])


class _InMessage:
    __slots__ = ("count", "message_type", "parts", "received", "size", "stored")

    def __init__(self, count: int, message_type: str) -> None:
        self.count = count
        self.message_type = message_type
        self.parts: list[bytes | None] = [None] * count
        self.received = 0
        self.stored = bytearray(count)
        self.size = 0


class DialogReceiver:
    """Receiving side of one dialog direction: ordering, reassembly, duplicate detection
    and the ack it owes. Normally owned by a `DialogPeer`."""

    def __init__(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        *,
        private_key: rsa.RSAPrivateKey | Sequence[rsa.RSAPrivateKey] | None,
        session_key: bytes | None = None,
        encrypted: bool = False,
        next_expected_seq: int = 0,
        held_fragments: Iterable[HeldFragment] = (),
        window: int = RECEIVE_WINDOW,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
    ) -> None:
        """Args:
        conversation_id, direction: which dialog direction this receives.
        private_key: this broker's key, to unwrap the session key on first contact; or
            its keys, current first (after a certificate rotation the previous keys
            still unwrap what peers wrapped before they learned the new certificate).
        session_key: the direction's key if already known (restored state).
        encrypted: the direction's bodies are encrypted (restored state: the envelope
            of the first contact said so).
        next_expected_seq: sequence number of the next message to deliver.
        held_fragments: durably held fragments of undelivered messages (restored).
        window: messages beyond `next_expected_seq` that are buffered; later ones
            are dropped unacked (the sender retries).
        max_buffered_bytes: payload of out-of-order fragments held in memory.
        """
        if not 1 <= window <= MAX_RECEIVE_WINDOW:
            raise LocalProtocolError(f"window {window} out of range", ErrorCode.BAD_ARGUMENT)
        self.conversation_id = conversation_id
        self.direction = direction
        self.session_key: bytes | None = None if session_key is None else bytes(session_key)
        self.closed = False
        self.duplicates = 0
        self.dropped = 0
        self._private_keys: tuple[rsa.RSAPrivateKey, ...] = (
            ()
            if private_key is None
            else (private_key,)
            if isinstance(private_key, rsa.RSAPrivateKey)
            else tuple(private_key)
        )
        self._seal = None if session_key is None else SessionSeal(session_key)
        self._cipher = (
            BodyCipher(session_key, conversation_id, int(direction))
            if encrypted and session_key is not None
            else None
        )
        self._header_prefix = FragmentFrame.header_prefix(conversation_id, direction)
        self._bundle_prefix = BundleFrame.header_prefix(conversation_id, direction)
        self._next_expected = next_expected_seq
        self._stored_below = next_expected_seq
        self._window = window
        self._max_buffered = max_buffered_bytes
        self._buffered = 0
        self._partials: dict[int, _InMessage] = {}
        self._unreported: set[tuple[int, int, int]] = set()
        self.ack_pending = False
        # ack scheduling bookkeeping owned by DialogPeer
        self._ack_generation = 0
        self._ack_scheduled = False
        for held in held_fragments:
            if held.seq < next_expected_seq:
                continue  # delivered already; the broker should have deleted it
            message = self._partials.get(held.seq)
            if message is None or message.count != held.fragment_count:
                if message is not None:
                    self._buffered -= message.size
                message = self._partials[held.seq] = _InMessage(
                    held.fragment_count, held.message_type
                )
            if (
                not 0 <= held.fragment_index < message.count
                or message.parts[held.fragment_index] is not None
            ):
                continue
            message.parts[held.fragment_index] = held.payload
            message.stored[held.fragment_index] = 1
            message.received += 1
            message.size += len(held.payload)
            self._buffered += len(held.payload)

    @property
    def next_expected_seq(self) -> int:
        """Sequence number of the next message to deliver."""
        return self._next_expected

    def partials(self) -> list[PartialMessage]:
        """The messages this receiver holds fragments of, in sequence order."""
        return [
            PartialMessage(seq, m.message_type, m.received, m.count, m.size)
            for seq, m in sorted(self._partials.items())
            if m.received
        ]

    def resume(self) -> list[DialogEvent]:
        """Deliver messages that restored held fragments already complete (after a crash
        between holding the last fragment and storing the message)."""
        events: list[DialogEvent] = []
        self._deliver_ready(events)
        return events

    # -- integrity

    def verify(self, frame: FragmentFrame) -> SessionKeyReceived | None:
        """Check a fragment's signature, adopting the wrapped session key on first contact.

        Returns: SessionKeyReceived when the key was just learned, else None.

        Raises: IntegrityError: no usable session key, or the signature does not verify.
        """
        if self._seal is not None:
            cid = frame.conversation_id
            if frame.direction is self.direction and (
                cid is self.conversation_id or cid == self.conversation_id
            ):
                # == frame.signed_header(), with this direction's constant part precomputed
                header = self._header_prefix + FragmentFrame.header_rest(
                    frame.seq,
                    frame.fragment_index,
                    frame.fragment_count,
                    frame.message_type,
                    frame.envelope,
                    frame.wrapped_session_key,
                    frame.ack,
                )
            else:
                header = frame.signed_header()
            self._seal.verify(frame.signature, header, frame.payload)
            return None
        if frame.wrapped_session_key is None:
            raise IntegrityError("no session key for this dialog direction yet")
        if not self._private_keys:
            raise IntegrityError("no private key to unwrap the session key")
        key = _unwrap_with_any(frame.wrapped_session_key, self._private_keys)
        seal = SessionSeal(key)
        seal.verify(frame.signature, frame.signed_header(), frame.payload)
        self._seal, self.session_key = seal, key
        if frame.envelope is not None and frame.envelope.encrypted:
            self._cipher = BodyCipher(key, self.conversation_id, int(self.direction))
        return SessionKeyReceived(
            self.conversation_id, self.direction, key, self._cipher is not None
        )

    def verify_bundle(self, frame: BundleFrame) -> None:
        """Check a bundle's signature (a bundle never carries the session key).

        Raises: IntegrityError: no session key yet, or the signature does not verify.
        """
        if self._seal is None:
            raise IntegrityError("no session key for this dialog direction yet")
        header = self._bundle_prefix + BundleFrame.header_rest(
            frame.seq, frame.message_type, frame.payloads, frame.ack
        )
        self._seal.verify_parts(frame.signature, header, frame.payloads)

    def _delivered(self, seq: int, message_type: str, body: bytes) -> MessageReceived:
        cipher = self._cipher
        if cipher is not None:
            try:
                body = cipher.decrypt(seq, message_type, body)
            except IntegrityError as exc:
                return MessageReceived(
                    self.conversation_id, self.direction, seq, message_type, b"", str(exc)
                )
        return MessageReceived(self.conversation_id, self.direction, seq, message_type, body)

    def receive_fragment(self, frame: FragmentFrame) -> list[DialogEvent]:
        """Verify then accept one fragment (standalone use; DialogPeer also handles acks).

        Raises: RemoteProtocolError: the fragment belongs to another direction.
        """
        try:
            key_event = self.verify(frame)
        except IntegrityError as exc:
            return [
                IntegrityFailure(
                    self.conversation_id, self.direction, frame.seq, frame.fragment_index, str(exc)
                )
            ]
        events = self.accept(frame)
        if key_event is not None:
            events.insert(0, key_event)
        return events

    # -- ordering and reassembly

    def accept(self, frame: FragmentFrame) -> list[DialogEvent]:
        """Accept one *verified* fragment.

        Returns: MessageReceived / FragmentReceived / PartialMessageDiscarded events.

        Raises: RemoteProtocolError: the fragment names another dialog direction.
        """
        self._check_direction(frame)
        return self._accept(
            frame.seq, frame.fragment_index, frame.fragment_count, frame.message_type, frame.payload
        )

    def accept_bundle(self, frame: BundleFrame) -> list[DialogEvent]:
        """Accept a *verified* bundle: each message as if it came in a fragment of its own.

        Raises: RemoteProtocolError: the bundle names another dialog direction.
        """
        self._check_direction(frame)
        mtype = frame.message_type
        if frame.seq == self._next_expected and not self._partials and self._cipher is None:
            # in order with nothing held: every message is delivered as it stands (each is
            # next in turn, so none can fall outside the window)
            self._next_expected += len(frame.payloads)
            return [
                MessagesReceived(
                    self.conversation_id, self.direction, frame.seq, mtype, frame.payloads
                )
            ]
        events: list[DialogEvent] = []
        for seq, payload in enumerate(frame.payloads, frame.seq):
            events += self._accept(seq, 0, 1, mtype, payload)
        return events

    def _check_direction(self, frame: FragmentFrame | BundleFrame) -> None:
        cid = frame.conversation_id
        if (
            cid is not self.conversation_id and cid != self.conversation_id
        ) or frame.direction is not self.direction:
            raise RemoteProtocolError(
                "fragment routed to the wrong dialog", ErrorCode.UNKNOWN_CONVERSATION
            )

    def _accept(
        self, seq: int, index: int, count: int, message_type: str, payload: bytes
    ) -> list[DialogEvent]:
        if seq < self._next_expected:
            self.duplicates += 1
            if seq < self._stored_below:
                self.ack_pending = True  # our ack was lost: the cumulative ack repairs it
            return []
        if seq >= self._next_expected + self._window:
            self.dropped += 1
            return []
        events: list[DialogEvent] = []
        message = self._partials.get(seq)
        if message is None:
            if count == 1 and seq == self._next_expected:
                self._next_expected += 1
                events.append(self._delivered(seq, message_type, payload))
                self._deliver_ready(events)
                return events
        elif message.count != count or message.message_type != message_type:
            self._buffered -= message.size
            del self._partials[seq]
            self._unreported = {entry for entry in self._unreported if entry[0] != seq}
            events.append(PartialMessageDiscarded(self.conversation_id, self.direction, seq))
            message = None
        if message is None:
            message = self._partials[seq] = _InMessage(count, message_type)
        if message.parts[index] is not None:
            self.duplicates += 1
            if message.stored[index]:
                self._unreported.add((seq, message.count, index))
                self.ack_pending = True
            return events
        size = len(payload)
        if seq != self._next_expected and self._buffered + size > self._max_buffered:
            self.dropped += 1
            if not message.received:
                del self._partials[seq]
            return events
        message.parts[index] = payload
        message.received += 1
        message.size += size
        self._buffered += size
        if message.received == message.count and seq == self._next_expected:
            self._deliver_ready(events)
        else:
            events.append(
                FragmentReceived(
                    self.conversation_id,
                    self.direction,
                    seq,
                    index,
                    message.count,
                    message.message_type,
                    payload,
                )
            )
        return events

    def _deliver_ready(self, events: list[DialogEvent]) -> None:
        partials = self._partials
        while (
            message := partials.get(self._next_expected)
        ) is not None and message.received == message.count:
            del partials[self._next_expected]
            self._buffered -= message.size
            body = b"".join(part for part in message.parts if part is not None)
            events.append(self._delivered(self._next_expected, message.message_type, body))
            self._next_expected += 1

    # -- durability and acks

    def mark_stored(self, event: MessageReceived | MessagesReceived | FragmentReceived) -> None:
        """The broker durably stored what `event` reported; it may now be acked.

        For MessageReceived and MessagesReceived the confirmation is cumulative: store
        messages in order (one call with the highest seq of a group commit is enough).

        Raises: LocalProtocolError: the event was never emitted by this receiver.
        """
        if not isinstance(event, FragmentReceived):
            last = event.seq if isinstance(event, MessageReceived) else event.last
            if last >= self._next_expected:
                raise LocalProtocolError(
                    f"message {last} was not delivered yet", ErrorCode.BAD_ARGUMENT
                )
            if last >= self._stored_below:
                self._stored_below = last + 1
                self.ack_pending = True
            return
        if event.seq < self._stored_below:
            return
        message = self._partials.get(event.seq)
        index = event.fragment_index
        if message is None or message.count != event.fragment_count or message.parts[index] is None:
            # delivered meanwhile (the message ack covers it) or discarded (stale layout)
            return
        message.stored[index] = 1
        self._unreported.add((event.seq, message.count, index))
        self.ack_pending = True

    def take_ack(self) -> AckRecord:
        """The ack owed now; clears `ack_pending` unless ranges had to be left for later."""
        ranges: list[tuple[int, int, int, int]] = []
        if self._unreported:
            below = self._stored_below
            entries = sorted(entry for entry in self._unreported if entry[0] >= below)
            rest: set[tuple[int, int, int]] = set()
            for position, (seq, count, index) in enumerate(entries):
                if (
                    ranges
                    and ranges[-1][0] == seq
                    and ranges[-1][1] == count
                    and ranges[-1][3] == index
                ):
                    ranges[-1] = (seq, count, ranges[-1][2], index + 1)
                elif len(ranges) < MAX_ACK_RANGES:
                    ranges.append((seq, count, index, index + 1))
                else:
                    rest = set(entries[position:])
                    break
            self._unreported = rest
        self.ack_pending = bool(self._unreported)
        return AckRecord(self._stored_below, tuple(ranges))

    def ack_frame(self, record: AckRecord) -> AckFrame | None:
        """A standalone ack frame sealed with this direction's key (None without a key)."""
        if self._seal is None:
            return None
        unsigned = AckFrame(self.conversation_id, self.direction, record, b"")
        return AckFrame(
            self.conversation_id, self.direction, record, self._seal.sign(unsigned.signed_header())
        )

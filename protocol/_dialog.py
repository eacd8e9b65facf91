"""Dialog protocol: exactly-once, in-order delivery of one dialog direction between brokers.

Theory of operation
-------------------
A dialog has two directions (`Direction.FROM_INITIATOR`, `Direction.FROM_TARGET`). Each is
sequenced on its own: the sending broker numbers sequenced messages (user messages,
EndDialog, Error) 0, 1, 2, ... and hands them to a `DialogSender`; the receiving broker's
`DialogReceiver` for the same (conversation, direction) delivers them exactly once, in that
order. Acks and protocol errors are unsequenced and never retried themselves: a lost ack
is repaired because the sender retries and the receiver acks the duplicate again.

Sender rules
  * A message is split into `count = ceil(len / fragment_size)` fragments of equal stride
    `ceil(len / count)`, so the layout is a function of the message and its count only.
  * Each fragment stays in the transmission queue until acked. The first transmission is
    followed by retries after `RetryPolicy` delays (4, 8, 16, 32, 64, 64, ... seconds).
  * At most `window` messages beyond the receiver's cumulative ack are in flight.
  * Fragments carry the direction's `Envelope` and wrapped session key until the first ack
    of the direction proves the receiver stored both.
  * When the envelope says `encrypted`, each message body is encrypted (`BodyCipher`)
    before it is fragmented; the fragments then carry ciphertext only.
  * `MessageAcked(seq)` means the receiver durably stored every fragment of `seq`: the
    broker may delete it from its transmission queue.
  * Between adjacent brokers that both speak protocol version 2 (`DialogPeer.bundling`),
    fresh whole messages of one type that follow each other in a confirmed direction go
    several to a `BundleFrame` (at most one fragment's worth of bytes, one signature):
    one frame to build, send, decode and verify instead of one each. Each message keeps
    its own retry entry; a retransmission goes as a fragment.

Receiver rules
  * A fragment is accepted only if its sealed MD5 signature verifies under the session
    key; otherwise it is dropped, not acked, and reported as `IntegrityFailure`.
  * A message is delivered (`MessageReceived`) only when complete and when every earlier
    message was delivered. Other accepted fragments are reported as `FragmentReceived` so
    the broker can hold them durably (status "disabled" in Service Broker's words).
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

Scheduling (`DialogPeer`, one per adjacent broker): retransmissions that fall due go
first, then fresh fragments one at a time, round-robin across dialogs within the highest
priority level, so small messages overtake the fragments of a large one. Starvation is
prevented: with a `starvation_bound`, a dialog that has waited that many seconds goes next
whatever its level; without one, every `STARVATION_EVERY`-th pick goes to the
longest-waiting dialog of any level. Acks ride on
fragments of the reverse direction of the same conversation; an ack with no ride goes alone
`ack_delay` seconds after it became pending. Timers are heaps with lazy deletion; nothing
scans all dialogs.

Time is always an argument (`now`, seconds, any monotonic origin). Nothing here does I/O.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives.asymmetric import rsa

from ._errors import ErrorCode, IntegrityError, LocalProtocolError, RemoteProtocolError
from ._framing import MAX_MESSAGE_SIZE_LIMIT
from ._integrity import (
    BODY_TAG_SIZE,
    BodyCipher,
    SessionSeal,
    unwrap_session_key,
    wrap_session_key,
)
from ._link import (
    MAX_ACK_RANGES,
    MAX_BUNDLE_MESSAGES,
    MAX_FRAGMENT_COUNT,
    MAX_FRAGMENT_SIZE,
    AckFrame,
    AckRecord,
    BundleFrame,
    Direction,
    Envelope,
    FragmentFrame,
    new_fragment_frame,
)

DEFAULT_FRAGMENT_SIZE: Final = 64 * 1024
MIN_FRAGMENT_SIZE: Final = 1
MAX_MESSAGE_SIZE: Final = MAX_MESSAGE_SIZE_LIMIT  # as on the client wire (see _framing)
RECEIVE_WINDOW: Final = 8192
MAX_RECEIVE_WINDOW: Final = 1 << 20
MAX_BUFFERED_BYTES: Final = 256 * 1024 * 1024
DEFAULT_ACK_DELAY: Final = 0.05
MAX_ACK_DELAY: Final = 1.0
DEFAULT_SEND_BATCH: Final = 256
MIN_PRIORITY: Final = 1
MAX_PRIORITY: Final = 10
DEFAULT_PRIORITY: Final = 5
STARVATION_EVERY: Final = 16


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retransmission backoff: `initial`, times `factor` per retry, capped at `maximum`."""

    initial: float = 4.0
    factor: float = 2.0
    maximum: float = 64.0

    def __post_init__(self) -> None:
        if not (self.initial > 0 and self.factor >= 1 and self.maximum >= self.initial):
            raise LocalProtocolError("invalid retry policy", ErrorCode.BAD_ARGUMENT)

    def delay(self, transmissions: int) -> float:
        """Seconds to wait for an ack after a fragment's `transmissions`-th send (1-based)."""
        delay = self.initial
        for _ in range(transmissions - 1):
            delay *= self.factor
            if delay >= self.maximum:
                return self.maximum
        return min(delay, self.maximum)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A complete message is next in order: store it in the target queue, advance the
    direction's next expected sequence number to `seq + 1`, delete its held fragments,
    then call `mark_stored`.

    `rejected`: why the message cannot be delivered although every fragment verified (an
    encrypted body that does not decrypt); the body is then empty.
    """

    conversation_id: uuid.UUID
    direction: Direction
    seq: int
    message_type: str
    body: bytes
    rejected: str = ""


@dataclass(frozen=True, slots=True)
class FragmentReceived:
    """A fragment of a message that cannot be delivered yet: hold it durably, then call
    `mark_stored`. Handed back to `DialogReceiver(held_fragments=...)` after a restart."""

    conversation_id: uuid.UUID
    direction: Direction
    seq: int
    fragment_index: int
    fragment_count: int
    message_type: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class PartialMessageDiscarded:
    """The sender re-fragmented message `seq` differently (it restarted with another
    fragment size): delete the held fragments of `seq`."""

    conversation_id: uuid.UUID
    direction: Direction
    seq: int


@dataclass(frozen=True, slots=True)
class SessionKeyReceived:
    """The direction's session key arrived: persist it with the receiver's state, in the
    same transaction as (or before) the fragments that follow. `encrypted`: the
    direction's bodies are encrypted (hand it back to `open_receiver` after a restart)."""

    conversation_id: uuid.UUID
    direction: Direction
    session_key: bytes
    encrypted: bool = False


@dataclass(frozen=True, slots=True)
class MessageAcked:
    """The receiver durably stored message `seq`: delete it from the transmission queue."""

    conversation_id: uuid.UUID
    direction: Direction
    seq: int


@dataclass(frozen=True, slots=True)
class IntegrityFailure:
    """A fragment or ack failed its integrity check and was dropped (not acked).

    `seq`/`fragment_index` are None for a standalone ack.
    """

    conversation_id: uuid.UUID
    direction: Direction
    seq: int | None
    fragment_index: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class UnknownDialog:
    """A fragment arrived for a (conversation, direction) with no open receiver.

    The broker either creates the endpoint from `frame.envelope` and calls
    `open_receiver` then `receive_frame(frame, now)` again, or drops it.
    """

    conversation_id: uuid.UUID
    direction: Direction
    frame: FragmentFrame


DialogEvent = (
    MessageReceived
    | FragmentReceived
    | PartialMessageDiscarded
    | SessionKeyReceived
    | MessageAcked
    | IntegrityFailure
    | UnknownDialog
)


@dataclass(frozen=True, slots=True)
class PendingMessage:
    """One unacked message of the transmission queue, as persisted by the broker."""

    seq: int
    message_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class PartialMessage:
    """A message a receiver holds some fragments of and cannot deliver yet (a message in
    flight, or one waiting for an earlier one): Service Broker's status 2."""

    seq: int
    message_type: str
    fragments_received: int
    fragment_count: int
    bytes_received: int


@dataclass(frozen=True, slots=True)
class HeldFragment:
    """One durably held fragment of an undelivered message, as persisted by the broker."""

    seq: int
    fragment_index: int
    fragment_count: int
    message_type: str
    payload: bytes


def fragment_layout(size: int, fragment_size: int) -> tuple[int, int]:
    """(fragment count, stride) of a message of `size` bytes.

    Raises: LocalProtocolError: the message needs more than MAX_FRAGMENT_COUNT fragments.
    """
    count = max(1, -(-size // fragment_size))
    if count > MAX_FRAGMENT_COUNT:
        raise LocalProtocolError(
            f"message of {size} bytes needs {count} fragments, limit {MAX_FRAGMENT_COUNT}",
            ErrorCode.BAD_ARGUMENT,
        )
    return count, -(-size // count)


# --------------------------------------------------------------------------- sender


class _OutMessage:
    __slots__ = (
        "acked",
        "acked_count",
        "body",
        "count",
        "done",
        "message_type",
        "next_unsent",
        "seq",
        "stride",
    )

    def __init__(self, seq: int, message_type: str, body: bytes, fragment_size: int) -> None:
        self.seq = seq
        self.message_type = message_type
        self.body = body
        self.count, self.stride = fragment_layout(len(body), fragment_size)
        self.acked = bytearray(self.count)
        self.acked_count = 0
        self.next_unsent = 0
        self.done = False

    def payload(self, index: int) -> bytes:
        if self.count == 1:
            return self.body
        start = index * self.stride
        return self.body[start : start + self.stride]


class DialogSender:
    """Sending side of one dialog direction: its slice of the transmission queue.

    Normally owned by a `DialogPeer`, which schedules its fragments; usable alone through
    `next_unsent`, `build_fragment` and `handle_ack`.
    """

    def __init__(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        envelope: Envelope,
        *,
        session_key: bytes,
        wrapped_session_key: bytes | None,
        next_seq: int = 0,
        pending: Iterable[PendingMessage] = (),
        fragment_size: int = DEFAULT_FRAGMENT_SIZE,
        priority: int = DEFAULT_PRIORITY,
        window: int = RECEIVE_WINDOW,
    ) -> None:
        """Args:
            conversation_id, direction: which dialog direction this sends.
            envelope: routing header for the receiver (sent until the first ack).
            session_key: this direction's key (persist it; new_session_key() makes one).
            wrapped_session_key: the key wrapped for the target broker, or None if the
                owning DialogPeer should wrap it with the peer's public key.
            next_seq: sequence number the next queued message will carry.
            pending: unacked messages restored from the transmission queue (seq < next_seq).
            fragment_size: largest fragment payload, MIN_FRAGMENT_SIZE..MAX_FRAGMENT_SIZE.
            priority: MIN_PRIORITY..MAX_PRIORITY; higher goes first.
            window: messages in flight beyond the receiver's cumulative ack.

        Raises: LocalProtocolError: an argument is out of range.
        """
        if not MIN_FRAGMENT_SIZE <= fragment_size <= MAX_FRAGMENT_SIZE:
            raise LocalProtocolError(
                f"fragment size {fragment_size} out of range", ErrorCode.BAD_ARGUMENT
            )
        if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise LocalProtocolError(f"priority {priority} out of range", ErrorCode.BAD_ARGUMENT)
        if not 1 <= window <= MAX_RECEIVE_WINDOW:
            raise LocalProtocolError(f"window {window} out of range", ErrorCode.BAD_ARGUMENT)
        self.conversation_id = conversation_id
        self.direction = direction
        self.envelope = envelope
        self.session_key = bytes(session_key)
        self.wrapped_session_key = wrapped_session_key
        self.priority = priority
        self.confirmed = False
        """True once the receiver acked this direction; fragments then omit envelope and key."""
        self.closed = False
        self._seal = SessionSeal(self.session_key)
        self._cipher = (
            BodyCipher(self.session_key, conversation_id, int(direction))
            if envelope.encrypted
            else None
        )
        self._header_prefix = FragmentFrame.header_prefix(conversation_id, direction)
        self._bundle_prefix = BundleFrame.header_prefix(conversation_id, direction)
        self._reverse_key = (conversation_id, direction.reverse)
        self._fragment_size = fragment_size
        self._window = window
        self._messages: dict[int, _OutMessage] = {}
        self._unsent: deque[_OutMessage] = deque()
        restored = sorted(pending, key=lambda m: m.seq)
        self._next_seq = next_seq
        self._acked_floor = restored[0].seq if restored else next_seq
        for message in restored:
            if not 0 <= message.seq < next_seq or message.seq in self._messages:
                raise LocalProtocolError(
                    f"pending message {message.seq} is not below next_seq {next_seq} or repeats",
                    ErrorCode.BAD_ARGUMENT,
                )
            self._add(message.seq, message.message_type, message.body)
        # scheduling bookkeeping owned by DialogPeer
        self._in_ready = False
        self._ready_stamp = 0
        self._ready_since = 0.0

    # -- queries

    @property
    def next_seq(self) -> int:
        """Sequence number the next `queue_message` must use."""
        return self._next_seq

    @property
    def unacked_count(self) -> int:
        """Messages still in the transmission queue (not fully acked)."""
        return len(self._messages)

    def unacked(self) -> list[PendingMessage]:
        """The transmission queue of this direction, in sequence order (bodies in clear)."""
        cipher = self._cipher
        return [
            PendingMessage(
                m.seq,
                m.message_type,
                m.body if cipher is None else cipher.decrypt(m.seq, m.message_type, m.body),
            )
            for m in sorted(self._messages.values(), key=lambda m: m.seq)
        ]

    # -- queueing

    def _add(self, seq: int, message_type: str, body: bytes) -> None:
        if len(body) > MAX_MESSAGE_SIZE - BODY_TAG_SIZE:
            raise LocalProtocolError(
                f"message of {len(body)} bytes exceeds {MAX_MESSAGE_SIZE - BODY_TAG_SIZE}",
                ErrorCode.BAD_ARGUMENT,
            )
        if self._cipher is not None:
            body = self._cipher.encrypt(seq, message_type, body)
        message = _OutMessage(seq, message_type, bytes(body), self._fragment_size)
        self._messages[seq] = message
        self._unsent.append(message)

    def skip_to(self, seq: int) -> None:
        """Sequence numbers from `next_seq` up to `seq` were sent and fully acknowledged
        before this sender was rebuilt (a restart resumes from the first unacknowledged
        message, and acks may have come out of order): the next message carries `seq`.

        Raises: LocalProtocolError: `seq` is below `next_seq`.
        """
        if seq < self._next_seq:
            raise LocalProtocolError(
                f"cannot skip back from {self._next_seq} to {seq}", ErrorCode.BAD_ARGUMENT
            )
        if not self._messages:
            self._acked_floor = seq
        self._next_seq = seq

    def queue_message(self, seq: int, message_type: str, body: bytes) -> None:
        """Add the next sequenced message of this direction.

        Raises: LocalProtocolError: `seq` is not `next_seq`, or the message is too large.
        """
        if self.closed:
            raise LocalProtocolError("sender is closed", ErrorCode.CONVERSATION_ENDED)
        if seq != self._next_seq:
            raise LocalProtocolError(
                f"expected sequence number {self._next_seq}, got {seq}", ErrorCode.BAD_ARGUMENT
            )
        self._add(seq, message_type, body)
        self._next_seq = seq + 1

    # -- sending

    def _unsent_head(self) -> _OutMessage | None:
        unsent = self._unsent
        while unsent:
            message = unsent[0]
            if message.done or message.next_unsent >= message.count:
                unsent.popleft()
                continue
            if message.seq >= self._acked_floor + self._window:
                return None
            return message
        return None

    def has_unsent(self) -> bool:
        """Whether a never-sent fragment is waiting inside the window."""
        return self._unsent_head() is not None

    def next_unsent(self) -> tuple[_OutMessage, int] | None:
        """Take the next never-sent fragment inside the window, in sequence order."""
        while (message := self._unsent_head()) is not None:
            index = message.next_unsent
            acked = message.acked
            while index < message.count and acked[index]:
                index += 1
            message.next_unsent = index + 1
            if index < message.count:
                return message, index
        return None

    def build_fragment(
        self, message: _OutMessage, index: int, ack: AckRecord | None, routed: bool = False
    ) -> FragmentFrame:
        """The signed frame for fragment `index` of `message`, carrying `ack` if given, and
        the envelope and wrapped key until the first ack, or always when `routed`.

        Raises: LocalProtocolError: the session key has not been wrapped for the target.
        """
        payload = message.body if message.count == 1 else message.payload(index)
        envelope: Envelope | None = None
        wrapped: bytes | None = None
        if routed or not self.confirmed:
            if self.wrapped_session_key is None:
                raise LocalProtocolError(
                    "session key not wrapped for the target broker", ErrorCode.BAD_ARGUMENT
                )
            envelope, wrapped = self.envelope, self.wrapped_session_key
        # == FragmentFrame.header_for(...), with the direction's constant part precomputed
        header = self._header_prefix + FragmentFrame.header_rest(
            message.seq, index, message.count, message.message_type, envelope, wrapped, ack
        )
        return new_fragment_frame(
            self.conversation_id,
            self.direction,
            message.seq,
            index,
            message.count,
            message.message_type,
            payload,
            self._seal.sign(header, payload),
            envelope,
            wrapped,
            ack,
        )

    def take_bundle(self, first: _OutMessage) -> list[_OutMessage]:
        """The never-sent messages that follow `first` (just taken by `next_unsent`) and
        may travel with it in one bundle: whole (one fragment), of its type, consecutive,
        inside the window; at most MAX_BUNDLE_MESSAGES in all and together no larger than
        one fragment. They are taken (marked sent)."""
        taken: list[_OutMessage] = []
        if first.count != 1:
            return taken
        room = self._fragment_size - len(first.body)
        expected = first.seq + 1
        end = min(self._acked_floor + self._window, first.seq + MAX_BUNDLE_MESSAGES)
        mtype = first.message_type
        for message in self._unsent:
            if message.seq < expected:
                continue
            if (
                message.seq != expected
                or expected >= end
                or message.count != 1
                or message.next_unsent
                or message.done
                or message.message_type != mtype
                or len(message.body) > room
            ):
                break
            message.next_unsent = 1
            room -= len(message.body)
            taken.append(message)
            expected += 1
        return taken

    def build_bundle(self, messages: list[_OutMessage], ack: AckRecord | None) -> BundleFrame:
        """The signed bundle of `messages` (from `take_bundle`, the first one first),
        carrying `ack` if given."""
        first = messages[0]
        payloads = tuple(message.body for message in messages)
        header = self._bundle_prefix + BundleFrame.header_rest(
            first.seq, first.message_type, payloads, ack
        )
        return BundleFrame(
            self.conversation_id,
            self.direction,
            first.seq,
            first.message_type,
            payloads,
            self._seal.sign_parts(header, payloads),
            ack,
        )

    def is_outstanding(self, message: _OutMessage, index: int) -> bool:
        """Whether fragment `index` of `message` still waits for its ack."""
        return not (self.closed or message.done or message.acked[index])

    # -- acks

    def verify_ack(self, frame: AckFrame) -> None:
        """Raises: IntegrityError: the standalone ack's signature does not verify."""
        self._seal.verify(frame.signature, frame.signed_header())

    def handle_ack(self, record: AckRecord) -> list[MessageAcked]:
        """Apply an (already verified) ack.

        Returns: one MessageAcked per message that became fully acked, in this call.
        """
        self.confirmed = True
        events: list[MessageAcked] = []
        messages = self._messages
        below = min(record.below, self._next_seq)
        if below > self._acked_floor:
            for seq in range(self._acked_floor, below):
                message = messages.pop(seq, None)
                if message is not None:
                    message.done = True
                    events.append(MessageAcked(self.conversation_id, self.direction, seq))
            self._acked_floor = below
        for seq, count, first, end in record.ranges:
            message = messages.get(seq)
            if message is None or message.count != count:
                continue  # already acked, or a range for another fragment layout
            acked = message.acked
            for index in range(first, end):
                if not acked[index]:
                    acked[index] = 1
                    message.acked_count += 1
            if message.acked_count == message.count:
                del messages[seq]
                message.done = True
                events.append(MessageAcked(self.conversation_id, self.direction, seq))
        return events


# --------------------------------------------------------------------------- receiver


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
        events: list[DialogEvent] = []
        mtype = frame.message_type
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

    def mark_stored(self, event: MessageReceived | FragmentReceived) -> None:
        """The broker durably stored what `event` reported; it may now be acked.

        For MessageReceived the confirmation is cumulative: store messages in order
        (one call with the highest seq of a group commit is enough).

        Raises: LocalProtocolError: the event was never emitted by this receiver.
        """
        if isinstance(event, MessageReceived):
            if event.seq >= self._next_expected:
                raise LocalProtocolError(
                    f"message {event.seq} was not delivered yet", ErrorCode.BAD_ARGUMENT
                )
            if event.seq >= self._stored_below:
                self._stored_below = event.seq + 1
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


# --------------------------------------------------------------------------- peer


@dataclass(slots=True)
class PeerCounters:
    """Running totals of one DialogPeer, for the transmission queue and connections views."""

    fragments_sent: int = 0
    retransmissions: int = 0
    standalone_acks: int = 0
    piggybacked_acks: int = 0
    integrity_failures: int = 0
    unknown_acks: int = 0


_Key = tuple[uuid.UUID, Direction]
_RetryEntry = tuple[float, int, DialogSender, _OutMessage, int, int]
_AckEntry = tuple[float, int, DialogReceiver, int]


class DialogPeer:
    """All dialog directions between this broker and one adjacent broker.

    It outlives TCP connections: frames it returns go on whichever connection is up;
    lost frames are repaired by retransmission.
    """

    def __init__(
        self,
        *,
        private_key: rsa.RSAPrivateKey | Sequence[rsa.RSAPrivateKey] | None = None,
        peer_public_key: rsa.RSAPublicKey | bytes | None = None,
        fragment_size: int = DEFAULT_FRAGMENT_SIZE,
        retry: RetryPolicy | None = None,
        ack_delay: float = DEFAULT_ACK_DELAY,
        window: int = RECEIVE_WINDOW,
        starvation_bound: float | None = None,
    ) -> None:
        """Args:
            starvation_bound: if set, a dialog whose fragments have waited this many
                seconds is served next whatever its priority; if None, every
                STARVATION_EVERY-th pick serves the longest-waiting dialog.
            private_key: this broker's key (unwraps session keys of inbound directions),
                or its keys, current first (see DialogReceiver).
            peer_public_key: the peer's public key or certificate PEM (wraps session keys
                of outbound directions opened without a wrapped key).
            fragment_size: largest fragment payload for outbound messages.
            retry: retransmission backoff; RetryPolicy() by default.
            ack_delay: how long an ack waits for return traffic before going alone.
            window: messages in flight / buffered beyond the cumulative ack, per direction.

        Raises: LocalProtocolError: an argument is out of range.
        """
        if not 0 <= ack_delay <= MAX_ACK_DELAY:
            raise LocalProtocolError(f"ack delay {ack_delay} out of range", ErrorCode.BAD_ARGUMENT)
        if not MIN_FRAGMENT_SIZE <= fragment_size <= MAX_FRAGMENT_SIZE:
            raise LocalProtocolError(
                f"fragment size {fragment_size} out of range", ErrorCode.BAD_ARGUMENT
            )
        self.counters = PeerCounters()
        self.private_key = private_key
        """Handed to receivers opened from now on; a broker that rotates its
        certificate sets its keys here, current first."""
        self._peer_public_key = peer_public_key
        self._fragment_size = fragment_size
        self._retry = retry if retry is not None else RetryPolicy()
        # retry.delay(n) at index n for the first few transmissions (a frozen policy)
        self._retry_delays = (0.0, *(self._retry.delay(n) for n in range(1, 9)))
        self._ack_delay = ack_delay
        self._window = window
        self._senders: dict[_Key, DialogSender] = {}
        self._receivers: dict[_Key, DialogReceiver] = {}
        self._tick = itertools.count()
        # Retry entries in (due, tick) order: a FIFO while they arrive in that order (the
        # common case: every first transmission waits the same delay and time only moves
        # forward), a heap for the rest. Entries of acked fragments are skipped lazily; in
        # the FIFO that costs O(1) each.
        self._retry_heap: list[_RetryEntry] = []
        self._retry_fifo: deque[_RetryEntry] = deque()
        self._retry_ready: deque[tuple[DialogSender, _OutMessage, int, int]] = deque()
        self._ack_heap: list[_AckEntry] = []
        self._ready: list[deque[DialogSender]] = [deque() for _ in range(MAX_PRIORITY + 1)]
        self._ready_count = 0
        self._picks = 0
        self._now = 0.0
        self._starvation_bound = starvation_bound
        self._starvation_checked = -1.0
        self.bundling = False
        """Whether fresh messages may go in bundles (`BundleFrame`): the owner sets it
        while the connection in use reaches this peer directly and speaks protocol
        version 2."""

    # -- dialogs

    def open_sender(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        envelope: Envelope,
        *,
        session_key: bytes,
        wrapped_session_key: bytes | None = None,
        next_seq: int = 0,
        pending: Iterable[PendingMessage] = (),
        priority: int = DEFAULT_PRIORITY,
    ) -> DialogSender:
        """Start (or, with `pending`, resume after a restart) sending one dialog direction.

        Raises: LocalProtocolError: already open, no way to wrap the session key, or a
            bad argument (see DialogSender).
        """
        key = (conversation_id, direction)
        if key in self._senders:
            raise LocalProtocolError(
                f"sender {conversation_id}/{direction.name} already open", ErrorCode.ALREADY_EXISTS
            )
        if wrapped_session_key is None:
            if self._peer_public_key is None:
                raise LocalProtocolError(
                    "no wrapped session key and no peer public key", ErrorCode.BAD_ARGUMENT
                )
            wrapped_session_key = wrap_session_key(session_key, self._peer_public_key)
        sender = DialogSender(
            conversation_id,
            direction,
            envelope,
            session_key=session_key,
            wrapped_session_key=wrapped_session_key,
            next_seq=next_seq,
            pending=pending,
            fragment_size=self._fragment_size,
            priority=priority,
            window=self._window,
        )
        self._senders[key] = sender
        self._make_ready(sender)
        return sender

    def open_receiver(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        *,
        session_key: bytes | None = None,
        encrypted: bool = False,
        next_expected_seq: int = 0,
        held_fragments: Iterable[HeldFragment] = (),
    ) -> list[DialogEvent]:
        """Start (or resume after a restart) receiving one dialog direction.

        Returns: MessageReceived events for messages the held fragments already complete.

        Raises: LocalProtocolError: already open.
        """
        key = (conversation_id, direction)
        if key in self._receivers:
            raise LocalProtocolError(
                f"receiver {conversation_id}/{direction.name} already open",
                ErrorCode.ALREADY_EXISTS,
            )
        receiver = DialogReceiver(
            conversation_id,
            direction,
            private_key=self.private_key,
            session_key=session_key,
            encrypted=encrypted,
            next_expected_seq=next_expected_seq,
            held_fragments=held_fragments,
            window=self._window,
        )
        self._receivers[key] = receiver
        return receiver.resume()

    def sender(self, conversation_id: uuid.UUID, direction: Direction) -> DialogSender | None:
        """The open sender of a direction, if any."""
        return self._senders.get((conversation_id, direction))

    def receiver(self, conversation_id: uuid.UUID, direction: Direction) -> DialogReceiver | None:
        """The open receiver of a direction, if any."""
        return self._receivers.get((conversation_id, direction))

    def receivers(self) -> list[DialogReceiver]:
        """Every open receiver."""
        return list(self._receivers.values())

    def close_sender(self, conversation_id: uuid.UUID, direction: Direction) -> None:
        """Forget a direction's sender (dialog ended and fully acked, or cleaned up)."""
        sender = self._senders.pop((conversation_id, direction), None)
        if sender is not None:
            sender.closed = True

    def close_receiver(self, conversation_id: uuid.UUID, direction: Direction) -> None:
        """Forget a direction's receiver; later fragments produce UnknownDialog."""
        receiver = self._receivers.pop((conversation_id, direction), None)
        if receiver is not None:
            receiver.closed = True

    # -- sending

    def queue_message(
        self,
        conversation_id: uuid.UUID,
        direction: Direction,
        seq: int,
        message_type: str,
        body: bytes,
    ) -> None:
        """Put the next sequenced message of an open sender on the transmission queue.

        Raises: LocalProtocolError: no such sender, wrong `seq`, or too large.
        """
        sender = self._senders.get((conversation_id, direction))
        if sender is None:
            raise LocalProtocolError(
                f"no sender for {conversation_id}/{direction.name}", ErrorCode.UNKNOWN_CONVERSATION
            )
        sender.queue_message(seq, message_type, body)
        self._make_ready(sender)

    def _make_ready(self, sender: DialogSender) -> None:
        if not sender._in_ready and not sender.closed and sender.has_unsent():
            sender._in_ready = True
            sender._ready_stamp = self._picks
            sender._ready_since = self._now
            self._ready[sender.priority].append(sender)
            self._ready_count += 1

    def _pick_fresh(self) -> tuple[DialogSender, _OutMessage, int] | None:
        while self._ready_count:
            self._picks += 1
            queue = self._choose_ready_queue()
            sender = queue.popleft()
            self._ready_count -= 1
            picked = None if sender.closed else sender.next_unsent()
            if picked is not None and sender.has_unsent():
                sender._ready_stamp = self._picks
                sender._ready_since = self._now
                queue.append(sender)
                self._ready_count += 1
            else:
                sender._in_ready = False
            if picked is not None:
                return sender, picked[0], picked[1]
        return None

    def _choose_ready_queue(self) -> deque[DialogSender]:
        ready = self._ready
        if self._starvation_bound is not None:
            # at most once per point in time: the bound is far coarser than one pick
            if self._now != self._starvation_checked:
                self._starvation_checked = self._now
                oldest: deque[DialogSender] | None = None
                for queue in ready:
                    if queue and (oldest is None or queue[0]._ready_since < oldest[0]._ready_since):
                        oldest = queue
                if (
                    oldest is not None
                    and self._now - oldest[0]._ready_since >= self._starvation_bound
                ):
                    return oldest
        elif self._picks % STARVATION_EVERY == 0:
            return min((q for q in ready if q), key=lambda queue: queue[0]._ready_stamp)
        for queue in reversed(ready):
            if queue:
                return queue
        raise AssertionError("no ready dialog although the ready count is positive")

    def _take_ack(self, receiver: DialogReceiver, now: float) -> AckRecord:
        record = receiver.take_ack()
        receiver._ack_generation += 1
        receiver._ack_scheduled = False
        if receiver.ack_pending:  # ranges left over: send the rest at once
            self._schedule_ack(receiver, now, 0.0)
        return record

    def _schedule_ack(
        self, receiver: DialogReceiver, now: float, delay: float | None = None
    ) -> None:
        if receiver.ack_pending and not receiver._ack_scheduled and not receiver.closed:
            receiver._ack_scheduled = True
            deadline = now + (self._ack_delay if delay is None else delay)
            heapq.heappush(
                self._ack_heap, (deadline, next(self._tick), receiver, receiver._ack_generation)
            )

    @property
    def wants_to_send(self) -> bool:
        """Whether `frames_to_send(now)` has fragments ready without waiting for a timer."""
        return bool(self._retry_ready) or self._ready_count > 0

    def frames_to_send(
        self, now: float, limit: int = DEFAULT_SEND_BATCH
    ) -> list[FragmentFrame | BundleFrame | AckFrame]:
        """Frames to write now: due retransmissions, then up to `limit` fragments in all,
        then standalone acks whose delay expired and found no ride.

        Call again while `wants_to_send` (the writer's buffer permitting), and at
        `get_timer()`.
        """
        self._now = max(self._now, now)
        self.handle_timer(now)
        frames: list[FragmentFrame | BundleFrame | AckFrame] = []
        counters = self.counters
        receivers = self._receivers
        retry = self._retry
        delays = self._retry_delays
        while len(frames) < limit:
            if self._retry_ready:
                sender, message, index, transmissions = self._retry_ready.popleft()
                if not sender.is_outstanding(message, index):
                    continue
                counters.retransmissions += 1
            else:
                picked = self._pick_fresh()
                if picked is None:
                    break
                sender, message, index = picked
                transmissions = 0
            ack = None
            receiver = receivers.get(sender._reverse_key)
            if receiver is not None and receiver.ack_pending:
                ack = self._take_ack(receiver, now)
                counters.piggybacked_acks += 1
            bundle = (
                sender.take_bundle(message)
                if transmissions == 0 and self.bundling and sender.confirmed
                else None
            )
            if bundle:
                # each message keeps its own retry entry: a lost bundle is retransmitted
                # message by message, as fragments
                bundle.insert(0, message)
                frames.append(sender.build_bundle(bundle, ack))
                counters.fragments_sent += len(bundle)
                due = now + delays[1]
                for member in bundle:
                    self._retry_later((due, next(self._tick), sender, member, 0, 1))
                continue
            # a retransmission carries the routing header again (see the sender rules)
            frames.append(sender.build_fragment(message, index, ack, transmissions > 0))
            counters.fragments_sent += 1
            transmissions += 1
            delay = (
                delays[transmissions] if transmissions < len(delays) else retry.delay(transmissions)
            )
            self._retry_later(
                (now + delay, next(self._tick), sender, message, index, transmissions)
            )
        heap = self._ack_heap
        while heap and heap[0][0] <= now:
            _, _, receiver, generation = heapq.heappop(heap)
            if (
                receiver.closed
                or generation != receiver._ack_generation
                or not receiver.ack_pending
            ):
                continue
            frame = receiver.ack_frame(self._take_ack(receiver, now))
            if frame is not None:
                frames.append(frame)
                counters.standalone_acks += 1
        return frames

    def _retry_later(self, entry: _RetryEntry) -> None:
        """File a sent fragment's retry: on the FIFO while entries come in due order."""
        fifo = self._retry_fifo
        if not fifo or entry[0] >= fifo[-1][0]:
            fifo.append(entry)
        else:
            heapq.heappush(self._retry_heap, entry)

    # -- timers

    def get_timer(self) -> float | None:
        """When `handle_timer`/`frames_to_send` next has work (retry or ack due), or None."""
        heap = self._retry_heap
        while heap and not heap[0][2].is_outstanding(heap[0][3], heap[0][4]):
            heapq.heappop(heap)
        fifo = self._retry_fifo
        while fifo and not fifo[0][2].is_outstanding(fifo[0][3], fifo[0][4]):
            fifo.popleft()
        acks = self._ack_heap
        while acks and (acks[0][2].closed or acks[0][3] != acks[0][2]._ack_generation):
            heapq.heappop(acks)
        times = [entries[0][0] for entries in (heap, fifo, acks) if entries]
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        """Move retransmissions due by `now` to the front of the send order."""
        heap = self._retry_heap
        fifo = self._retry_fifo
        ready = self._retry_ready
        while True:
            # the earlier (due, tick) of both fronts, as one heap would have popped them
            if fifo and fifo[0][0] <= now and (not heap or fifo[0][:2] < heap[0][:2]):
                _, _, sender, message, index, transmissions = fifo.popleft()
            elif heap and heap[0][0] <= now:
                _, _, sender, message, index, transmissions = heapq.heappop(heap)
            else:
                return
            if sender.is_outstanding(message, index):
                ready.append((sender, message, index, transmissions))

    def retransmit_all(self, now: float) -> None:
        """Make every unacked, already-sent fragment due at `now` (e.g. after a new
        connection replaced one that died), keeping each fragment's backoff step."""
        entries = [*self._retry_heap, *self._retry_fifo]
        self._retry_heap = []
        self._retry_fifo.clear()
        for due, tick, sender, message, index, transmissions in entries:
            if sender.is_outstanding(message, index):
                self._retry_heap.append(
                    (min(due, now), tick, sender, message, index, transmissions)
                )
        heapq.heapify(self._retry_heap)

    # -- receiving

    def receive_frame(
        self, frame: FragmentFrame | BundleFrame | AckFrame, now: float
    ) -> list[DialogEvent]:
        """Process one fragment or standalone ack from the peer.

        Returns: events for the broker, in the order it must apply them.

        Raises: RemoteProtocolError: the frame is inconsistent with the dialog state.
        """
        if isinstance(frame, AckFrame):
            sender = self._senders.get((frame.conversation_id, frame.direction))
            if sender is None:
                self.counters.unknown_acks += 1
                return []
            try:
                sender.verify_ack(frame)
            except IntegrityError as exc:
                self.counters.integrity_failures += 1
                return [
                    IntegrityFailure(frame.conversation_id, frame.direction, None, None, str(exc))
                ]
            return self._apply_ack(sender, frame.ack)
        receiver = self._receivers.get((frame.conversation_id, frame.direction))
        key_event: SessionKeyReceived | None = None
        # accept() and the piggybacked ack touch different objects: apply both, then
        # order the events as key, acks, accepted
        if isinstance(frame, BundleFrame):
            if receiver is None:
                # no envelope to open the direction with: its messages come again as
                # fragments that carry it (see the sender rules)
                return []
            try:
                receiver.verify_bundle(frame)
            except IntegrityError as exc:
                return self._integrity_failure(frame, 0, exc)
            events = receiver.accept_bundle(frame)
        else:
            if receiver is None:
                return [UnknownDialog(frame.conversation_id, frame.direction, frame)]
            try:
                key_event = receiver.verify(frame)
            except IntegrityError as exc:
                return self._integrity_failure(frame, frame.fragment_index, exc)
            events = receiver.accept(frame)
        if frame.ack is not None:
            sender = self._senders.get((frame.conversation_id, frame.direction.reverse))
            if sender is not None:
                events[:0] = self._apply_ack(sender, frame.ack)
        if key_event is not None:
            events.insert(0, key_event)
        self._schedule_ack(receiver, now)
        return events

    def _integrity_failure(
        self, frame: FragmentFrame | BundleFrame, index: int, exc: IntegrityError
    ) -> list[DialogEvent]:
        self.counters.integrity_failures += 1
        return [
            IntegrityFailure(frame.conversation_id, frame.direction, frame.seq, index, str(exc))
        ]

    def _apply_ack(self, sender: DialogSender, record: AckRecord) -> list[DialogEvent]:
        events: list[DialogEvent] = list(sender.handle_ack(record))
        self._make_ready(sender)  # the window may have opened
        return events

    def mark_stored(self, events: Iterable[MessageReceived | FragmentReceived], now: float) -> None:
        """The broker committed what these events reported; their acks may now go out."""
        for event in events:
            receiver = self._receivers.get((event.conversation_id, event.direction))
            if receiver is not None:
                receiver.mark_stored(event)
                self._schedule_ack(receiver, now)

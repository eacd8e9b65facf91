"""Dialog sender: one dialog direction's slice of the transmission queue.

Theory of operation
-------------------
The sender's rules:
  * A message is split into `count = ceil(len / fragment_size)` fragments of equal stride
    `ceil(len / count)`, so the layout is a function of the message and its count only.
  * Each fragment stays in the transmission queue until acked. The first transmission is
    followed by retries after `RetryPolicy` delays (4, 8, 16, 32, 64, 64, ... seconds).
  * At most `window` messages beyond the receiver's cumulative ack are in flight.
  * Fragments carry the direction's `Envelope` and wrapped session key until the first ack
    of the direction proves the receiver stored both.
  * When the envelope says `encrypted`, each message body is encrypted (`BodyCipher`)
    before it is fragmented; the fragments then carry ciphertext only.
  * `MessageAcked(seq, last)` means the receiver durably stored every fragment of the
    messages `seq`..`last` (one event a run of one message type): the broker may delete
    them from its transmission queue.
  * Between adjacent brokers that both speak protocol version 2 (`DialogPeer.bundling`),
    fresh whole messages of one type that follow each other in a confirmed direction go
    several to a `BundleFrame` (at most one fragment's worth of bytes, one signature):
    one frame to build, send, decode and verify instead of one each. A bundle waits
    behind one retry entry; what of it is unacked when that falls due goes again as
    fragments, one a message.

Time is never read here: the owning `DialogPeer` decides when a fragment goes (and goes
again); the sender says which fragment is next and builds its signed frame.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable
from typing import Final

from ._dialog_events import MessageAcked, PendingMessage
from ._dialog_frames import (
    AckFrame,
    AckRecord,
    BundleFrame,
    Direction,
    Envelope,
    FragmentFrame,
    new_fragment_frame,
)
from ._errors import ErrorCode, LocalProtocolError
from ._fields import MAX_BUNDLE_MESSAGES, MAX_FRAGMENT_COUNT, MAX_FRAGMENT_SIZE
from ._framing import MAX_MESSAGE_SIZE_LIMIT
from ._integrity import BODY_TAG_SIZE, BodyCipher, SessionSeal
from ._receiver import MAX_RECEIVE_WINDOW, RECEIVE_WINDOW

DEFAULT_FRAGMENT_SIZE: Final = 64 * 1024
MIN_FRAGMENT_SIZE: Final = 1
MAX_MESSAGE_SIZE: Final = MAX_MESSAGE_SIZE_LIMIT  # as on the client wire (see _framing)
MIN_PRIORITY: Final = 1
MAX_PRIORITY: Final = 10
DEFAULT_PRIORITY: Final = 5


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
        size = len(body)
        # one fragment (the common case) without the general layout's arithmetic
        self.count, self.stride = (
            (1, size) if size <= fragment_size else fragment_layout(size, fragment_size)
        )
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
        self.unacked_bytes = 0
        """The bodies of the messages not fully acked, as held (encrypted, if so)."""
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
        self.unacked_bytes += len(message.body)
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
        """Add the next sequenced message of this direction (a sender a DialogPeer owns
        takes it through `DialogPeer.queue_message(s)`, which counts what is unacked).

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

    def unsent_size(self) -> int:
        """Payload bytes of the fragment `next_unsent` would take (at most: the last
        fragment of a message may be shorter), 0 when none waits."""
        message = self._unsent_head()
        if message is None:
            return 0
        return len(message.body) if message.count == 1 else message.stride

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

    def take_bundle(self, first: _OutMessage, max_bytes: int | None = None) -> list[_OutMessage]:
        """The never-sent messages that follow `first` (just taken by `next_unsent`) and
        may travel with it in one bundle: whole (one fragment), of its type, consecutive,
        inside the window; at most MAX_BUNDLE_MESSAGES in all and together no larger than
        one fragment (nor than `max_bytes`). They are taken (marked sent)."""
        taken: list[_OutMessage] = []
        if first.count != 1:
            return taken
        size = self._fragment_size if max_bytes is None else min(max_bytes, self._fragment_size)
        room = size - len(first.body)
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
        """Apply an (already verified) ack (a sender a DialogPeer owns takes acks through
        the peer's `receive_frame`, which counts what is unacked).

        Returns: the messages that became fully acked in this call, one MessageAcked per
        run of consecutive messages of one type, in sequence order.
        """
        self.confirmed = True
        events: list[MessageAcked] = []
        messages = self._messages
        cid = self.conversation_id
        direction = self.direction
        below = min(record.below, self._next_seq)
        released = 0
        if below > self._acked_floor:
            first = -1
            last = 0
            run_type = ""
            for seq in range(self._acked_floor, below):
                message = messages.pop(seq, None)
                if message is None:
                    continue  # acked before, by a range
                message.done = True
                released += len(message.body)
                if message.message_type != run_type or first < 0:
                    if first >= 0:
                        events.append(MessageAcked(cid, direction, first, last, run_type))
                    first = seq
                    run_type = message.message_type
                last = seq
            if first >= 0:
                events.append(MessageAcked(cid, direction, first, last, run_type))
            self._acked_floor = below
        for seq, count, first_index, end in record.ranges:
            message = messages.get(seq)
            if message is None or message.count != count:
                continue  # already acked, or a range for another fragment layout
            acked = message.acked
            for index in range(first_index, end):
                if not acked[index]:
                    acked[index] = 1
                    message.acked_count += 1
            if message.acked_count == message.count:
                del messages[seq]
                message.done = True
                released += len(message.body)
                events.append(MessageAcked(cid, direction, seq, seq, message.message_type))
        self.unacked_bytes -= released
        return events

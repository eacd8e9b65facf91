"""What the dialog layer tells the broker, and what the broker keeps for it.

Events (`DialogEvent`) come out of `DialogPeer.receive_frame` and `open_receiver`, in
the order the broker must apply them; each says what to store or delete and whether to
call `mark_stored` afterwards. The records (`PendingMessage`, `HeldFragment`) are what
the broker persists of the transmission queue and of held fragments and hands back after
a restart; `PartialMessage` describes a message still arriving, for views.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ._dialog_frames import Direction, FragmentFrame


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
class MessagesReceived:
    """Complete messages are next in order, a bundle's worth: `bodies[i]` is message
    `seq + i`'s, all of `message_type`. The same as a MessageReceived for each (none is
    rejected), reported at once: store them all, then call `mark_stored`."""

    conversation_id: uuid.UUID
    direction: Direction
    seq: int
    message_type: str
    bodies: tuple[bytes, ...]

    @property
    def last(self) -> int:
        """The last message's sequence number."""
        return self.seq + len(self.bodies) - 1


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
    """The receiver durably stored messages `seq`..`last`, all of `message_type`: delete
    them from the transmission queue. One event covers a run of consecutive messages of
    one type that an ack completed (numbers in the run that an earlier ack completed are
    acknowledged already and covered again)."""

    conversation_id: uuid.UUID
    direction: Direction
    seq: int
    last: int
    message_type: str


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
    | MessagesReceived
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

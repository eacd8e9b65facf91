"""What applying the dialog events of one read gathers for its end (see `inbound`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ssb.protocol import Direction, Envelope, FragmentReceived, MessageReceived, MessagesReceived

DirectionId = tuple[uuid.UUID, Direction]


@dataclass(slots=True, eq=False)
class Arrivals:
    """Consecutive messages of one dialog direction and type, delivered together."""

    message_type: str
    seq: int
    bodies: list[bytes]
    envelope: Envelope


class Applying:
    """The messages to deliver (per direction, one enqueue each), the events to
    acknowledge once durable (each direction's last message, whose ack covers the ones
    before it, and the fragments held), each direction's next sequence number to
    persist, and the acknowledged ranges of messages sent (one transmission-queue delete
    each)."""

    __slots__ = ("acked", "arrivals", "fragments", "next_seqs", "received")

    def __init__(self) -> None:
        self.received: dict[DirectionId, MessageReceived | MessagesReceived] = {}
        self.fragments: list[FragmentReceived] = []
        self.next_seqs: dict[DirectionId, int] = {}
        self.arrivals: dict[DirectionId, Arrivals] = {}
        self.acked: dict[DirectionId, list[int]] = {}

    @property
    def stored(self) -> bool:
        """Whether it holds events to acknowledge once durable."""
        return bool(self.received or self.fragments)

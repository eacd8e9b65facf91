"""The transmission queue: sequenced messages that wait before they are delivered.

Theory of operation. A message waits here when it cannot go into its target queue at
once: its target lives on another broker (it waits until that broker acknowledges it),
or on this broker behind a queue that is OFF or behind earlier waiting messages of its
dialog direction (it waits until `Delivery` releases it). The queue is the store's
`transmission_queue` table; in memory each dialog direction with waiting entries has a
`DialogOutbox`, a backlog (see `backlog`) of its entries: a small record and what the
message cache allows of the bodies.

An entry's row is written when it is held; it leaves when it is delivered here, when
the far broker acknowledged it, or when its endpoint is gone. The transport takes a
remote direction's entries (`pull`) only once their rows are durable, so a crash can
never make a sequence number mean two messages. A direction's outbox is let go once
it is empty; its next entry makes a new one (`is_current` tells the transport which).
Entries held for a queue of this broker are counted in that queue (`held`,
`held_bytes`), for its views and quota.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from . import catalog as cat
from .backlog import ITEM_OVERHEAD, Backlog, MessageCache
from .ports import Journal, Row, Span
from .queues import Queue


@dataclass(slots=True, eq=False)
class Outbound:
    """A sequenced message waiting in the transmission queue."""

    id: int
    handle: uuid.UUID
    conversation_id: uuid.UUID
    to_service: str
    to_broker_instance: str | None
    from_service: str
    contract: str
    is_initiator: bool
    seq: int
    message_type: str
    validation: str
    body: bytes
    enqueue_time: float
    priority: int
    status: str = ""
    extra: bytes | None = None  # a message that came from another broker: that broker's id
    batch: int = 0  # the store batch holding its row

    @property
    def key(self) -> int:
        return self.seq  # a direction's entries are stored and read in sequence order

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def resident_size(self) -> int:
        return ITEM_OVERHEAD + len(self.body)

    @property
    def spillable(self) -> bool:
        return True

    @property
    def from_broker_instance(self) -> str | None:
        return None if self.extra is None else self.extra.decode()

    def row(self) -> Row:
        return (
            self.id,
            self.handle,
            self.conversation_id,
            self.to_service,
            self.to_broker_instance,
            self.from_service,
            self.contract,
            int(self.is_initiator),
            self.seq,
            self.message_type,
            self.validation,
            self.body,
            self.enqueue_time,
            self.priority,
            self.status,
            self.extra,
        )

    @classmethod
    def from_row(cls, row: Row) -> Outbound:
        values = list(row)
        values[1] = uuid.UUID(bytes=values[1])
        values[2] = uuid.UUID(bytes=values[2])
        values[7] = bool(values[7])
        return cls(*values)


DirectionKey = tuple[uuid.UUID, bool]  # (conversation id, sent by the initiator)


class DialogOutbox(Backlog[Outbound]):
    """The transmission-queue entries of one dialog direction, in send order."""

    __slots__ = (
        "conversation_id",
        "is_initiator",
        "journal",
        "local",
        "priority",
        "releasing",
        "status",
        "to_broker_instance",
        "to_service",
    )

    def __init__(self, cache: MessageCache, journal: Journal, first: Outbound, local: bool) -> None:
        super().__init__(cache)
        self.journal = journal
        self.conversation_id = first.conversation_id
        self.is_initiator = first.is_initiator
        self.to_service = first.to_service
        self.to_broker_instance = first.to_broker_instance
        self.priority = first.priority
        self.local = local  # waits for a queue of this broker (else for another broker)
        self.status = first.status  # why it waits, in words
        self.releasing = False

    def __repr__(self) -> str:
        return f"transmission queue of dialog {self.conversation_id}"

    @property
    def direction(self) -> DirectionKey:
        return (self.conversation_id, self.is_initiator)

    def _read(self, span: Span) -> list[Outbound]:
        rows = self.journal.read_transmission(self.conversation_id, self.is_initiator, span)
        return [Outbound.from_row(row) for row in rows]

    def _next_key(self, after: int, before: int | None) -> int | None:
        return self.journal.next_transmission_seq(
            self.conversation_id, self.is_initiator, after, before
        )


class TransmissionQueue:
    """Every dialog direction's waiting entries, by direction (`outboxes`)."""

    def __init__(
        self,
        journal: Journal,
        cache: MessageCache,
        catalog: cat.Catalog,
        queues: dict[str, Queue],
    ) -> None:
        self.journal = journal
        self.cache = cache
        self.catalog = catalog
        self.queues = queues
        self.outboxes: dict[DirectionKey, DialogOutbox] = {}
        self._next_outbound = 1

    def restore_ids(self, max_outbound: int) -> None:
        self._next_outbound = max_outbound + 1

    def target_queue(self, service_name: str) -> Queue | None:
        """The queue of this broker's service `service_name`, if both exist."""
        service = self.catalog.services.get(service_name)
        return None if service is None else self.queues.get(service.queue)

    # ---- holding and letting go -----------------------------------------------------

    def hold(self, out: Outbound, local: bool) -> DialogOutbox:
        """Write `out`'s row and add it to its direction's outbox (`local`: it waits for
        a queue of this broker)."""
        return self.hold_many([out], local)

    def hold_many(self, outs: list[Outbound], local: bool) -> DialogOutbox:
        """`hold` for entries of one direction, in order (a SEND's messages)."""
        insert = self.journal.insert_transmission
        for out in outs:
            out.id = self._next_outbound
            self._next_outbound += 1
            insert(out.row())
        batch = self.journal.watermark()
        for out in outs:
            out.batch = batch
        first = outs[0]
        key = (first.conversation_id, first.is_initiator)
        box = self.outboxes.get(key)
        if box is None:
            box = self.outboxes[key] = DialogOutbox(self.cache, self.journal, first, local)
        box.extend(outs)
        if local:
            target = self.target_queue(first.to_service)
            if target is not None:
                target.held += len(outs)
                target.held_bytes += sum(out.size for out in outs)
        return box

    def restore(self, first: Outbound, count: int, local: bool) -> DialogOutbox:
        """A direction's waiting entries after a restart: all on disk, from `first`'s seq."""
        box = DialogOutbox(self.cache, self.journal, first, local)
        box.count = box.spilled = count
        box.spilled_from = first.seq
        self.outboxes[box.direction] = box
        if local:
            target = self.target_queue(first.to_service)
            if target is not None:
                target.held += count
        return box

    def make_local(self, box: DialogOutbox) -> None:
        """`box`, never sent anywhere, turns out to wait for a queue of this broker (its
        service was created here): its queue counts its entries from now on."""
        box.local, box.status = True, ""
        target = self.target_queue(box.to_service)
        if target is not None:
            target.held += box.count
            target.held_bytes += box.bytes

    def unhold(self, out: Outbound) -> None:
        """A local entry taken from its outbox to be delivered: its queue no longer
        counts it."""
        target = self.target_queue(out.to_service)
        if target is not None:
            target.held -= 1
            target.held_bytes = max(0, target.held_bytes - out.size)

    def let_go(self, box: DialogOutbox) -> None:
        """Forget `box` if it is empty and still its direction's outbox."""
        if not box.count and self.outboxes.get(box.direction) is box:
            del self.outboxes[box.direction]

    def drop(self, conversation_id: uuid.UUID, is_initiator: bool) -> None:
        """Forget what a direction still has in the transmission queue."""
        box = self.outboxes.pop((conversation_id, is_initiator), None)
        if box is not None and box.local:
            target = self.target_queue(box.to_service)
            if target is not None:
                target.held -= box.count
                target.held_bytes = max(0, target.held_bytes - box.bytes)
        if box is not None:
            box.clear()
        self.journal.delete_transmission_direction(conversation_id, is_initiator)

    # ---- the way out to other brokers -------------------------------------------------

    def outbox(self, direction: DirectionKey) -> DialogOutbox | None:
        """The outbox holding a dialog direction's waiting entries, if it has any."""
        return self.outboxes.get(direction)

    def is_current(self, box: DialogOutbox) -> bool:
        """Whether `box` still holds its direction's waiting entries: `pull` lets go of a box
        it empties, and the next entry of the direction makes a new one."""
        return self.outboxes.get(box.direction) is box

    def pull(self, box: DialogOutbox, limit: int, max_bytes: int) -> list[Outbound]:
        """Durable entries of a remote direction, for the transport to send (in order)."""
        durable = self.journal.durable
        taken = box.take(limit, max_bytes, 0, lambda out: out.batch <= durable)
        if not box.count and self.outboxes.get(box.direction) is box:
            del self.outboxes[box.direction]
        return taken

    def remote_outboxes(self) -> list[DialogOutbox]:
        return [box for box in self.outboxes.values() if not box.local]

"""Service queues in memory: conversation groups, their conversations, and who may take them.

Theory of operation. A queue holds conversation groups; a group holds, per
conversation that has ready messages, a `Conversation`: a backlog (see `backlog`) of
its ready messages in arrival order, which is sequence order since a dialog delivers
in order. Everything else about a message lives in the store; memory keeps per
conversation a small record and what the message cache allows of the bodies.

A group is *eligible* when it has ready messages and no transaction holds its lock.
Eligible groups sit in a heap keyed by (-priority, queuing order of the group's
oldest ready message): the top is the highest-priority group and, within a level,
the one that has waited longest, so choosing the next group for RECEIVE is O(log n)
and equal levels are served fairly. The heap is lazy: each group remembers the key of
its one live entry; entries whose key no longer matches are skipped when popped and
swept when they outnumber live groups.

A group object lives in `groups` while it has ready messages, an owner or lock waiters,
and then in a small cache of idle groups (IDLE_GROUPS per queue), with the records of
its conversations, so a conversation that drains after every message does not rebuild
them each time; the conversation groups themselves (which endpoint belongs to which)
are the endpoints'.

Counters (exact, including writes not yet durable): `ready` messages that a RECEIVE
could take; `messages` and `bytes` of every message stored in the queue (ready, taken
by an open transaction, retained, parked); `retained` per conversation. Quotas
(`max_messages`, `max_bytes`) count `messages` / `bytes` plus what waits in the
transmission queue for this queue (`held`).
"""

from __future__ import annotations

import heapq
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from ssb.protocol import MAX_MESSAGE_SIZE_LIMIT, ROW_OVERHEAD, pack, unpack

from .backlog import ITEM_OVERHEAD, Backlog, MessageCache
from .catalog import QueueDef
from .names import plain
from .ports import Journal, Row, Span


class Status(IntEnum):
    """A message row's status in the store. RETAINED and READY are the RECEIVE column's
    values; the others are where the store keeps messages out of conversation order."""

    RETAINED = 0
    READY = 1
    PARKED = 6  # out of its queue until `parked_until` (poison policy "park")
    REQUEUED = 7  # ready, at the head of its conversation (re-queued dead letter, unparked)


# a stored status to its member without the enum's own lookup, which costs most of
# building a message from its row (a deep drain builds every message that way)
_STATUS_OF: Final = {status.value: status for status in Status}


@dataclass(slots=True, eq=False)
class Message:
    queuing_order: int
    conversation: Conversation
    message_sequence_number: int
    message_type_name: str
    validation: str
    message_body: bytes | None  # None once the body was dropped from memory (it is on disk)
    message_enqueue_time: float
    size: int
    status: Status = Status.READY
    delivery_count: int = 0  # deliveries so far; persisted when a receive rolls back
    batch: int = 0  # the store batch holding this row's insert
    parked_until: float | None = None
    parks: int = 0
    last_error: str = ""  # what the last reader that rolled back reported
    dead_letter_reason: str | None = None
    origin_queue: str | None = None  # the queue a dead letter came from

    @property
    def key(self) -> int:
        return self.queuing_order

    @property
    def resident_size(self) -> int:
        return ITEM_OVERHEAD + (self.size if self.message_body is not None else 0)

    @property
    def spillable(self) -> bool:
        return self.status is Status.READY

    @property
    def queue(self) -> str:
        return self.conversation.queue

    @property
    def conversation_handle(self) -> uuid.UUID:
        return self.conversation.handle

    @property
    def conversation_group_id(self) -> uuid.UUID:
        return self.conversation.group_id

    def extra(self) -> bytes | None:
        """What the store keeps beyond the plain columns (None for most messages)."""
        if (
            self.dead_letter_reason is None
            and self.parked_until is None
            and not self.parks
            and not self.last_error
        ):
            return None
        conv = self.conversation
        return pack(
            {
                "reason": self.dead_letter_reason,
                "origin": self.origin_queue,
                "group": conv.group_id,
                "service": conv.service,
                "contract": conv.contract,
                "priority": conv.priority,
                "parked_until": self.parked_until,
                "parks": self.parks,
                "error": self.last_error,
            }
        )

    def restore_extra(self, extra: bytes | None) -> None:
        if extra is None:
            return
        data = unpack(extra)
        self.dead_letter_reason = data.get("reason")
        self.origin_queue = data.get("origin")
        self.parked_until = data.get("parked_until")
        self.parks = data.get("parks", 0)
        self.last_error = data.get("error", "")

    def wire(self, body: bytes) -> list[Any]:
        """The RECEIVE row, in protocol MESSAGE_COLUMNS order."""
        conv = self.conversation
        return [
            int(self.status) if self.status is Status.RETAINED else 1,
            conv.priority,
            self.queuing_order,
            conv.group_id,
            conv.handle,
            self.message_sequence_number,
            conv.service,
            conv.contract,
            self.message_type_name,
            self.validation,
            body,
            self.message_enqueue_time,
            self.delivery_count,
            self.dead_letter_reason,
        ]

    def row(self) -> Row:
        """The store row (see _store.MESSAGE_COLUMNS)."""
        assert self.message_body is not None
        return (
            self.queuing_order,
            self.conversation.queue,
            self.conversation.handle,
            self.message_sequence_number,
            self.message_type_name,
            self.validation,
            self.message_body,
            self.message_enqueue_time,
            int(self.status),
            self.delivery_count,
            self.extra(),
            self.size,
        )


def dead_letter_identity(extra: bytes | None) -> tuple[uuid.UUID, str, str, int] | None:
    """(group, service, contract, priority) a dead letter carries, from its stored extra."""
    if extra is None:
        return None
    data = unpack(extra)
    if data.get("reason") is None:
        return None
    return data["group"], data["service"], data["contract"], data["priority"]


class Conversation(Backlog[Message]):
    """One conversation's ready messages in one queue."""

    __slots__ = (
        "contract",
        "dead_letters",
        "group",
        "handle",
        "journal",
        "priority",
        "queue",
        "service",
    )

    def __init__(
        self,
        cache: MessageCache,
        journal: Journal,
        queue: str,
        group: Group,
        handle: uuid.UUID,
        priority: int,
        service: str,
        contract: str,
    ) -> None:
        super().__init__(cache)
        self.journal = journal
        self.queue = queue
        self.group = group
        self.handle = handle
        self.priority = priority
        self.service = service
        self.contract = contract
        self.dead_letters = False  # dead letters of a conversation whose endpoint is elsewhere

    def __repr__(self) -> str:
        return f"conversation {self.handle} in queue {self.queue!r}"

    @property
    def group_id(self) -> uuid.UUID:
        return self.group.id

    def message(self, row: Row) -> Message:
        """A message of this conversation from its store row."""
        order, _, _, seq, mtype, letter, body, enqueued, stored, count, extra, size = row
        status = _STATUS_OF.get(stored)
        if status is None:
            status = Status(stored)  # not a status: the enum says so
        message = Message(order, self, seq, mtype, letter, body, enqueued, size, status, count)
        if extra is not None:
            message.restore_extra(extra)
        return message

    def _read(self, span: Span) -> list[Message]:
        return [
            self.message(row)
            for row in self.journal.read_ready_messages(self.queue, self.handle, span)
        ]

    def _next_key(self, after: int, before: int | None) -> int | None:
        return self.journal.next_ready_order(self.queue, self.handle, after, before)


GroupKey = tuple[int, int]


class Group:
    """A conversation group: the unit of locking and of RECEIVE."""

    __slots__ = ("conversations", "heap_key", "id", "lock_waiters", "owner")

    def __init__(self, group_id: uuid.UUID) -> None:
        self.id = group_id
        # the records of its conversations that this queue holds (some may be empty)
        self.conversations: dict[uuid.UUID, Conversation] = {}
        self.owner: object | None = None  # the Transaction holding the lock
        self.heap_key: GroupKey | None = None
        self.lock_waiters: list[Callable[[], None]] = []

    def _next(self) -> tuple[GroupKey, Conversation] | None:
        """The conversation RECEIVE would take from first, and its (priority, order) key."""
        best: tuple[GroupKey, Conversation] | None = None
        for conv in self.conversations.values():
            first = conv.first_key()
            if first is None:
                continue
            key = (-conv.priority, first)
            if best is None or key < best[0]:
                best = (key, conv)
        return best

    def key(self) -> GroupKey | None:
        best = self._next()
        return None if best is None else best[0]

    def next_conversation(self) -> Conversation | None:
        best = self._next()
        return None if best is None else best[1]

    def ready(self) -> bool:
        # a plain loop: any() with a generator costs twice as much on this hot path
        for conv in self.conversations.values():  # noqa: SIM110
            if conv.count:
                return True
        return False

    def ready_conversation(self, handle: uuid.UUID) -> Conversation | None:
        conv = self.conversations.get(handle)
        return conv if conv is not None and conv.count else None

    def message_count(self) -> int:
        return sum(c.count for c in self.conversations.values())

    @property
    def idle(self) -> bool:
        if self.owner is not None or self.lock_waiters:
            return False
        for conv in self.conversations.values():  # noqa: SIM110 - see ready()
            if conv.count:
                return False
        return True


ANSWER_BYTES: Final = MAX_MESSAGE_SIZE_LIMIT  # what the rows of one answer may carry
IDLE_GROUPS: Final = 1024  # idle group objects a queue keeps for reuse
IDLE_RECORDS: Final = 8  # empty conversation records an idle group keeps at most


@dataclass(slots=True)
class Told:
    """Happenings told in the log now and then: how many since the last line about them
    (`count`), and when that line was (`at`; None: none yet)."""

    count: int = 0
    at: float | None = None

    def due(self, now: float, every: float) -> bool:
        """Whether a line may be told now (none for `every` seconds)."""
        return self.at is None or now - self.at >= every

    def tell(self, now: float) -> int:
        """A line is told now: the count it tells, counting starts again."""
        count, self.count, self.at = self.count, 0, now
        return count


class Queue:
    """One service queue's live state."""

    def __init__(self, definition: QueueDef, cache: MessageCache, journal: Journal) -> None:
        self.definition = definition
        self.cache = cache
        self.journal = journal
        self.groups: dict[uuid.UUID, Group] = {}
        self._idle: OrderedDict[uuid.UUID, Group] = OrderedDict()
        self._heap: list[tuple[int, int, uuid.UUID]] = []
        self.ready = 0
        self.messages = 0
        self.bytes = 0
        self.retained: dict[uuid.UUID, list[int]] = {}  # handle -> [count, bytes]
        self.held = 0  # transmission-queue entries waiting for this queue
        self.held_bytes = 0
        self.waiters: deque[Any] = deque()
        self.kick_scheduled = False
        self.rollback_streak = 0
        self.quota_refusals = Told()  # statements refused for its quota (see `Capacity`)
        self.given_back = Told()  # messages put back by rollbacks refused for room
        self.disabled_reason = ""
        self.last_empty_rowset: float | None = None
        self.last_receive: float | None = None
        # since start, for metrics: messages enqueued, received (committed), put back
        self.enqueued = 0
        self.received = 0
        self.rolled_back = 0

    @property
    def name(self) -> str:
        return self.definition.name

    def receivable(self) -> bool:
        """Whether a new reader could receive now: some ready message is in a group no
        transaction holds. Stops at the first such group; locked groups are few (each
        belongs to an open transaction)."""
        if not self.ready:
            return False
        return any(group.owner is None and group.ready() for group in self.groups.values())

    @property
    def has_quota(self) -> bool:
        d = self.definition
        return d.max_messages is not None or d.max_bytes is not None

    def group(self, group_id: uuid.UUID) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self._idle.pop(group_id, None) or Group(group_id)
            self.groups[group_id] = group
        return group

    def drop_if_idle(self, group: Group) -> None:
        if group.idle and self.groups.get(group.id) is group:
            del self.groups[group.id]
            if len(group.conversations) > IDLE_RECORDS:
                group.conversations.clear()
            idle = self._idle
            idle[group.id] = group
            if len(idle) > IDLE_GROUPS:
                # its records point back at it: unlink them, or only the cycle collector frees them
                idle.popitem(last=False)[1].conversations.clear()

    def conversation(
        self, group: Group, handle: uuid.UUID, priority: int, service: str, contract: str
    ) -> Conversation:
        """The conversation's backlog in `group`, made if it has none (`service` and
        `contract` are keys; it keeps the plain names RECEIVE shows)."""
        conv = group.conversations.get(handle)
        if conv is None:
            conv = self._new_conversation(group, handle, priority, service, contract)
            group.conversations[handle] = conv
        return conv

    def loose_conversation(
        self, group_id: uuid.UUID, handle: uuid.UUID, priority: int, service: str, contract: str
    ) -> Conversation:
        """A record of one conversation's messages in this queue that the queue does not
        keep: to read stored messages through (parked ones, a view's)."""
        return self._new_conversation(Group(group_id), handle, priority, service, contract)

    def _new_conversation(
        self, group: Group, handle: uuid.UUID, priority: int, service: str, contract: str
    ) -> Conversation:
        return Conversation(
            self.cache,
            self.journal,
            self.name,
            group,
            handle,
            priority,
            plain(service),
            plain(contract),
        )

    # ---- quotas ---------------------------------------------------------------------

    def over_quota(self, count: int, nbytes: int) -> str | None:
        """Why `count` more messages of `nbytes` would break this queue's quota, if so."""
        d = self.definition
        if d.max_messages is not None and self.messages + self.held + count > d.max_messages:
            return (
                f"queue '{self.name}' is full: it holds {self.messages + self.held} of its"
                f" max_messages = {d.max_messages}"
            )
        if d.max_bytes is not None and self.bytes + self.held_bytes + nbytes > d.max_bytes:
            return (
                f"queue '{self.name}' is full: it holds {self.bytes + self.held_bytes} bytes of"
                f" its max_bytes = {d.max_bytes}"
            )
        return None

    # ---- eligibility -------------------------------------------------------------------

    def touch(self, group: Group) -> None:
        """Recompute the group's place in the heap after any change to it."""
        if group.owner is not None:
            group.heap_key = None
            return
        key = group.key()
        if key != group.heap_key:
            group.heap_key = key
            if key is not None:
                heapq.heappush(self._heap, (key[0], key[1], group.id))
                if len(self._heap) > 2 * len(self.groups) + 64:
                    self._sweep()

    def _sweep(self) -> None:
        live = [
            (g.heap_key[0], g.heap_key[1], g.id)
            for g in self.groups.values()
            if g.heap_key is not None
        ]
        heapq.heapify(live)
        self._heap = live

    def peek_eligible(self) -> Group | None:
        heap = self._heap
        while heap:
            negprio, order, gid = heap[0]
            group = self.groups.get(gid)
            if group is not None and group.heap_key == (negprio, order):
                return group
            heapq.heappop(heap)
        return None

    def to_read_ahead(self, top: int) -> Conversation | None:
        """The conversation the next RECEIVE would take from first, if some of its first
        `top` messages are on disk only (see `read_ahead`)."""
        group = self.peek_eligible()
        conv = None if group is None else group.next_conversation()
        return conv if conv is not None and conv.wants(top) else None

    def read_ahead(self, top: int) -> None:
        """Read the next eligible group's first spilled messages from the store now, so
        that its RECEIVE finds them resident."""
        conv = self.to_read_ahead(top)
        if conv is not None:
            conv.read_ahead(top)

    # ---- messages --------------------------------------------------------------------------

    def add(self, message: Message) -> None:
        """A new ready message at the end of its conversation (already a counted row)."""
        conv = message.conversation
        conv.group.conversations.setdefault(conv.handle, conv)
        had = conv.count
        conv.append(message)
        self.ready += 1
        if not had:
            self.touch(conv.group)

    def add_many(self, conv: Conversation, messages: list[Message]) -> None:
        """New ready messages at the end of one conversation (already counted rows; `conv`
        from `conversation()`, so registered in its group)."""
        had = conv.count
        conv.extend(messages)
        self.ready += len(messages)
        if not had:
            self.touch(conv.group)

    def add_front(self, message: Message) -> None:
        """One ready message at the head of its conversation (re-queue, end of a park)."""
        conv = self._live(message)
        conv.appendleft(message)
        self.ready += 1
        self.touch(conv.group)

    def _live(self, message: Message) -> Conversation:
        """The conversation record that now holds `message`'s conversation (the group object
        it remembers may have gone idle meanwhile)."""
        old = message.conversation
        group = self.group(old.group.id)
        conv = group.conversations.get(old.handle)
        if conv is None:
            conv = group.conversations[old.handle] = old
            old.group = group
        elif conv is not old:
            message.conversation = conv
        return conv

    def take(
        self, group: Group, top: int, handle: uuid.UUID | None, max_bytes: int = ANSWER_BYTES
    ) -> list[Message]:
        """Remove up to `top` ready messages of `group` (of one conversation if given),
        within `max_bytes` of answer (always at least one message)."""
        if handle is not None:
            one = group.ready_conversation(handle)
            order = [one] if one is not None else []
        else:
            order = sorted(
                (c for c in group.conversations.values() if c.count),
                key=lambda c: (-c.priority, c.first_key() or 0),
            )
        taken: list[Message] = []
        used = 0
        for conv in order:
            if len(taken) >= top or (taken and used + ROW_OVERHEAD >= max_bytes):
                break
            # the first message of an answer always goes; after it, the byte budget rules
            budget = max_bytes - used if taken else max_bytes
            got = conv.take(top - len(taken), budget, ROW_OVERHEAD)
            if taken and got and used + got[0].size + ROW_OVERHEAD > max_bytes:
                conv.restore(got)  # a later conversation's first message does not fit
                break
            taken += got
            used += sum(m.size + ROW_OVERHEAD for m in got)
            if conv.count and len(taken) < top:
                break  # the byte budget stopped it: the rest waits for the next RECEIVE
        self.ready -= len(taken)
        self.touch(group)
        return taken

    def restore(self, messages: list[Message]) -> None:
        """Put taken messages back exactly where they were."""
        by_conv: dict[int, list[Message]] = {}
        convs: dict[int, Conversation] = {}
        for message in messages:
            conv = self._live(message)
            by_conv.setdefault(id(conv), []).append(message)
            convs[id(conv)] = conv
        for ident, items in by_conv.items():
            conv = convs[ident]
            conv.restore(items)
            self.ready += len(items)
            self.touch(conv.group)

    def remove(self, message: Message) -> bool:
        """Take one resident ready message out of its conversation (poison handling)."""
        conv = message.conversation
        if conv.group.conversations.get(conv.handle) is not conv or not conv.remove(message):
            return False
        self.ready -= 1
        self.touch(conv.group)
        return True

    def drop_conversation(self, group_id: uuid.UUID, handle: uuid.UUID) -> int:
        """Forget a conversation's ready and retained messages (the caller deletes the rows);
        returns how many rows that removes from the queue."""
        count = nbytes = 0
        group = self.groups.get(group_id)
        conv = group.conversations.pop(handle, None) if group is not None else None
        if group is not None and conv is not None:
            count, nbytes = conv.count, conv.bytes
            conv.clear()
            self.ready -= count
            self.touch(group)
            self.drop_if_idle(group)
        kept = self.retained.pop(handle, None)
        if kept is not None:
            count += kept[0]
            nbytes += kept[1]
        self.messages -= count
        self.bytes -= nbytes
        return count

    def drop_all(self) -> None:
        """Forget every message of this queue (DROP QUEUE; the caller deletes the rows)."""
        for group in list(self.groups.values()):
            for conv in group.conversations.values():
                conv.clear()
            group.conversations.clear()
        self.groups.clear()
        self._idle.clear()
        self._heap.clear()
        self.retained.clear()
        self.ready = self.messages = self.bytes = 0

    def retain(self, message: Message) -> None:
        kept = self.retained.setdefault(message.conversation.handle, [0, 0])
        kept[0] += 1
        kept[1] += message.size

    def counted(self, message: Message) -> None:
        """A row of this queue was inserted."""
        self.enqueued += 1
        self.messages += 1
        self.bytes += message.size

    def uncounted(self, message: Message) -> None:
        """A row of this queue was deleted."""
        self.messages -= 1
        self.bytes -= message.size

    def conversations(self) -> Iterator[Conversation]:
        """Every conversation with ready messages."""
        for group in self.groups.values():
            for conv in group.conversations.values():
                if conv.count:
                    yield conv
